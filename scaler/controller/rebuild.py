"""Rebuilding partitions' state: each from its newest snapshot, then the batches that follow it.

The one way state is rebuilt, for the controller's start and take-overs and for `scaler replay`.
While EVENTS still holds everything from seq 1, a snapshot only saves time. Once retention has
dropped the oldest batches, a partition's snapshot is what those batches left behind: a
partition whose snapshot does not reach the stream's first kept batch (or that has none usable)
may have lost batches nobody holds any more, and its state cannot be rebuilt exactly. That is
refused (`Uncovered`), never guessed: the controller keeps its snapshots ahead of retention
(scaler/controller/snapshotter.py), so in normal operation it does not happen.
"""

import asyncio
from collections.abc import Callable, Iterable

from scaler.controller.leases import ranges
from scaler.controller.ledger import Ledger
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.proto.events import Batch
from scaler.proto.subjects import PARTITIONS, partition, partition_events
from scaler.store import ALL, EventStore
from scaler.store.stream import Kept


class Uncovered(Exception):
    """Retention dropped batches of partitions that no usable snapshot holds."""

    def __init__(self, message: str, partitions: list[int]) -> None:
        super().__init__(message)
        self.partitions = partitions


def covers(snap: Snapshot | None, at: Kept) -> bool:
    """Whether the partition can be rebuilt exactly from `snap` (None: from the stream alone) and what is kept."""
    return not at.truncated or (snap is not None and snap.seq + 1 >= at.first_seq)


async def snapshots(store: SnapshotStore, at: Kept, partitions: Iterable[int]) -> dict[int, Snapshot | None]:
    """Each partition's newest usable snapshot; Uncovered when one cannot be rebuilt exactly."""
    snaps, uncovered = await usable(store, at, partitions)
    if uncovered is not None:
        raise uncovered
    return snaps


async def usable(
    store: SnapshotStore, at: Kept, partitions: Iterable[int]
) -> tuple[dict[int, Snapshot | None], Uncovered | None]:
    """The newest usable snapshot of each partition that can be rebuilt exactly, and why the others cannot."""
    partitions = list(partitions)
    found = await asyncio.gather(*(store.load(p, at.stream_id, at.last_seq) for p in partitions))
    snaps = dict(zip(partitions, found, strict=True))
    uncovered = [p for p, snap in snaps.items() if not covers(snap, at)]
    if not uncovered:
        return snaps, None
    p = uncovered[0]
    snap = snaps[p]
    holds = f"its snapshot holds only up to seq {snap.seq:,}" if snap else "it has no usable snapshot"
    which = f"partitions {ranges(uncovered)}" if len(uncovered) > 1 else f"partition {p}"
    why = Uncovered(
        f"{which} cannot be rebuilt exactly: retention dropped EVENTS before seq {at.first_seq:,} and"
        f" {holds} (partition {p}); start the version that wrote the snapshots, or a fresh store",
        uncovered,
    )
    return {p: snap for p, snap in snaps.items() if p not in uncovered}, why


def restore(ledger: Ledger, snaps: dict[int, Snapshot | None]) -> dict[int, int]:
    """Put the snapshots into `ledger`; returns where each partition's batches resume (its watermark)."""
    after = {}
    for p, snap in snaps.items():
        after[p] = snap.seq if snap is not None else 0
        if snap is not None:
            ledger.restore(snap.states, snap.features, snap.last_seq, snap.wake, snap.seq)
    return after


async def fold_after(
    events: EventStore,
    after: dict[int, int],
    on_batch: Callable[[int, Batch], bool | None],
    subject: str | None = None,
    until_seq: int | None = None,
    on_stamp: Callable[[Batch, int, str], None] | None = None,
) -> int:
    """Call `on_batch` for each batch of the partitions in `after` above its watermark, in stream order.

    Reads `subject` when given (one function), else the partitions' own subjects, or the whole
    stream once when they are most of it. Returns how many batches were passed on. `on_stamp` is told
    the server stamp of each one passed on (scaler/controller/clocks.py).
    """
    passed = 0

    def pass_on(seq: int, batch: Batch) -> bool | None:
        nonlocal passed
        if seq > after.get(partition(batch.key), seq):
            passed += 1
            return on_batch(seq, batch)
        return None

    def stamped(batch: Batch, server_ms: int, writer: str) -> None:
        if on_stamp is not None and partition(batch.key) in after:
            on_stamp(batch, server_ms, writer)

    if not after:
        return 0
    if subject is not None or len(after) > PARTITIONS // 2:
        await events.read(pass_on, subject or ALL, min(after.values()), until_seq, stamped)
    else:
        reads = (events.read(pass_on, partition_events(p), seq, until_seq, stamped) for p, seq in after.items())
        await asyncio.gather(*reads)
    return passed
