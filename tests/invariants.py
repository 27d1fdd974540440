"""What must hold after any fault, read from the store itself."""

from collections import Counter, defaultdict

from scaler.controller.ledger import Ledger
from scaler.controller.snapshots import SnapshotStore
from scaler.proto.events import Assigned, Batch, Released
from scaler.proto.subjects import PARTITIONS, partition
from scaler.store import stream


class Assignments:
    """Each request's assignments in the stored log, as a replay's `seen`: a request is assigned twice when it
    is assigned while it still holds an instance. An assignment given back by a cancel (its caller gave up
    before it heard the answer) was never served, and a retry of the request is served anew."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.twice: list[str] = []

    def __call__(self, seq: int, batch: Batch) -> None:
        for e in batch.events:
            if isinstance(e, Assigned):
                if self.held[e.request_id]:
                    self.twice.append(e.request_id)
                self.held[e.request_id] += 1
            elif isinstance(e, Released) and e.cancelled:
                self.held[e.request_id] -= 1

    @property
    def requests(self) -> set[str]:
        """Every request ever assigned."""
        return set(self.held)


async def snapshots_hold_what_they_claim(js) -> list[str]:
    """Each partition's snapshot holds exactly the stream's batches it claims: no batch at or below the watermark is
    left out, and (while the stream holds every batch from seq 1) every function's state is the fold of its
    batches up to its `last_seq`. Returns the breaches.

    The snapshots are read before the stream: a node still running may write one meanwhile, and a snapshot
    read after the stream could claim batches the read did not reach."""
    at = await stream.kept(js)
    store = SnapshotStore(js)
    await store.open(create=False)
    snaps = {p: await store.load(p, at.stream_id, at.last_seq) for p in range(PARTITIONS)}
    batches: dict[str, list[tuple[int, Batch]]] = defaultdict(list)
    await stream.read(js, lambda seq, b: batches[b.key].append((seq, b)))
    breaches = []
    for p, snap in snaps.items():
        if snap is None:
            continue
        for key in {k for k in batches if partition(k) == p} | set(snap.states):
            upto = snap.last_seq.get(key, snap.seq)
            if left_out := [seq for seq, _ in batches[key] if upto < seq <= snap.seq]:
                breaches.append(f"partition {p}'s snapshot (seq {snap.seq}) claims {key}'s batches {left_out}")
            if at.truncated:  # the batches before the first kept one are only in the snapshot
                continue
            folded = Ledger()
            for seq, batch in batches[key]:
                if seq <= upto:
                    folded.fold(seq, batch)
            if folded.states.get(key) != snap.states.get(key):
                breaches.append(f"partition {p}'s snapshot of {key} is not its batches up to seq {upto}")
    return breaches
