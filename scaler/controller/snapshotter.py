"""Snapshots of the partitions a node serves, kept ahead of the stream's retention.

A partition is snapshotted after `every` events, or when it has unsaved events and its last
snapshot is `interval_s` old, or none. Every `guard_every_s` the stream's extent is looked at: a partition
whose snapshot is older than a quarter of the retention's age, or, once EVENTS holds half its byte
limit (or has dropped batches), falls into the older half of what it keeps, is snapshotted, so that
the batches retention drops are always held by a snapshot; and the stream's own limits are brought
to the node's retention once every partition has such a snapshot. A snapshot is taken only just
after the partition's lease was confirmed ours (`fence`, a compare-and-set renewal:
scaler/controller/leases.py), so it never claims batches another owner wrote: a node that lost a
lease, or is giving up one it no longer holds, writes none.
"""

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from nats.js.errors import NotFoundError

from scaler.controller.leases import ranges
from scaler.controller.ledger import Ledger
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.proto.subjects import EVENTS, PARTITIONS, partition
from scaler.runtime.clock import Clock
from scaler.runtime.faults import LastingFault
from scaler.runtime.tasks import cancelled
from scaler.store import EventStore, Kept, Retention
from scaler.store.config import limits_off

log = logging.getLogger("scaler.controller")

SNAPSHOT_EVERY = 10_000  # events in a partition
SNAPSHOT_INTERVAL_S = 60.0
GUARD_EVERY_S = 1.0  # how often the stream's retention is compared with the snapshots


class Snapshotter:
    def __init__(
        self,
        events: EventStore,
        store: SnapshotStore,
        ledger: Ledger,
        clock: Clock,
        retention: Retention,
        serving: set[int],
        floor: Callable[[int, set[int] | None], int],
        fence: Callable[[int, int | None], Awaitable[bool]],
        tenure: Callable[[int], int | None],
        lost: Callable[[str], Awaitable[None]],
        stream_id: str,
        every: int = SNAPSHOT_EVERY,
        interval_s: float = SNAPSHOT_INTERVAL_S,
        guard_every_s: float = GUARD_EVERY_S,
    ) -> None:
        self.events = events
        self.store = store
        self.ledger = ledger
        self.clock = clock
        self.retention = retention
        self.serving = serving  # the node's partitions (the set itself, kept up to date by the node)
        self.floor = floor  # the write path's floor: no watermark above an append under way
        self.fence = fence  # whether the partition's lease is still ours (within a holding of it), renewed just now
        self.tenure = tenure  # which holding of the partition's lease this node is in now (None: it holds none)
        self.lost = lost  # EVENTS lost batches this node holds: reload (and say why)
        self.stream_id = stream_id
        self.every = every
        self.interval_s = interval_s
        self.guard_every_s = guard_every_s
        self.stopping = False  # every partition given back is snapshotted, at the newest watermark
        self.saved_s: float | None = None  # wall clock of the last snapshot written (metrics)
        self._unsaved: Counter[int] = Counter()  # events appended since the partition's last snapshot
        self._saved_at: dict[int, float] = {}
        self._saving: dict[int, asyncio.Task] = {}
        self._snap_seq: dict[int, int] = {}  # the watermark of each partition's newest snapshot (0: none)
        self._loads: Counter[int] = Counter()  # per partition, a new count each time its state is loaded or forgotten
        self._seen = 0  # the stream's last sequence when last looked at (see watermark)
        self._first = 0  # ... and its first
        self._retention_set = False  # the stream's limits are ours (see _apply_retention)
        self._behind = 0  # looks in a row that found the stream behind this node
        self._guard: asyncio.Task | None = None
        self._failing = LastingFault(log, "snapshots", level=logging.WARNING)  # the store away or full: one line

    def start(self) -> None:
        self._guard = asyncio.create_task(self._keep_ahead())

    async def stop(self) -> None:
        """Stop guarding, and look at the stream once more so that the last snapshots take the newest watermark."""
        self.stopping = True
        await cancelled(self._guard)
        with contextlib.suppress(Exception):  # NATS away: the snapshots are as fresh as the last guard made them
            async with asyncio.timeout(1):
                self._seen = max(self._seen, (await self.events.kept()).last_seq)

    def keys(self, partitions: set[int]) -> list[str]:
        return [k for k in self.ledger.states if partition(k) in partitions]

    def snapshot(self, partitions: set[int] | None = None) -> Snapshot:
        """A consistent copy of the state (of some partitions): FnState is immutable, so copying is enough."""
        ledger = self.ledger
        keys = ledger.states if partitions is None else self.keys(partitions)
        return Snapshot(
            seq=self.watermark(partitions),
            at_ms=self.clock.now_ms(),
            stream=self.stream_id,
            last_seq={k: ledger.last_seq[k] for k in keys if k in ledger.last_seq},
            states={k: ledger.states[k] for k in keys},
            features={k: ledger.features[k] for k in keys if k in ledger.features},
            wake={k: ledger.wake[k] for k in keys if k in ledger.wake},
        )

    def watermark(self, partitions: set[int] | None = None) -> int:
        """A sequence at or above every batch of those partitions (all when None) that the state holds, and below
        every one it lacks.

        The newest we folded or appended, or the stream's last when last looked at, if newer: our
        partitions' batches are all ours, and one appended after that look lands above it; but
        never above an append under way, stored and not yet applied, nor above a batch of theirs in doubt
        (sent without an answer, or stored while they were given up): it may land later. An idle node's
        watermark thus follows the stream that other nodes fill, and stays ahead of its retention.
        """
        return self.floor(max(self.ledger.seq, self._seen), partitions)

    def suspects_loss(self) -> bool:
        """The last look found the stream behind this node (a loss, unless the next look finds it caught up): until
        then what a command decides is answered only once stored, or once its function's end of the stream
        is read (scaler/controller/path/lane.py)."""
        return self._behind > 0

    def restart(self, stream_id: str, last_seq: int) -> None:
        """The stream was found behind this node: what was seen of the old one no longer counts."""
        self.stream_id, self._seen, self._first, self._behind = stream_id, last_seq, 0, 0

    def loaded(self, p: int, snap_seq: int, last_seq: int) -> None:
        """Partition `p` was rebuilt from its snapshot at `snap_seq` and the stream up to `last_seq`."""
        self._loads[p] += 1
        self._snap_seq[p] = snap_seq
        if snap_seq < last_seq:  # a snapshot now spares the next start (or owner) what was just read
            self._unsaved[p] += 1
        self._saved_at[p] = asyncio.get_running_loop().time()

    def appended(self, p: int, events: int) -> None:
        """`events` more of partition `p` are stored: a snapshot when enough are unsaved, or long enough."""
        self._unsaved[p] += events
        if (saving := self._saving.get(p)) is not None and not saving.done():
            return
        now = asyncio.get_running_loop().time()
        if self._unsaved[p] >= self.every or now - self._saved_at.get(p, now) >= self.interval_s:
            self._saving[p] = asyncio.create_task(self.save(p))

    def claimed(self, p: int) -> int:
        """The watermark of partition `p`'s snapshot this node loaded or wrote last (0: none)."""
        return self._snap_seq.get(p, 0)

    def forget(self, partitions: list[int]) -> None:
        for p in partitions:
            self._loads[p] += 1
            self._unsaved.pop(p, None)
            self._snap_seq.pop(p, None)

    async def save(self, p: int, force: bool = False, tenure: int | None = None) -> None:
        """Snapshot one partition (after the one being written, if any), if it changed or `force`.

        Only of the state it was asked of, within the holding of the lease it was asked in (`tenure`; by default the
        one now): a save that waited (behind another, or for the lease's renewal) while the lease was lost and taken
        again, or the partition reloaded, would otherwise snapshot what this node held before under the stream's
        newest watermark, or a partition half loaded."""
        tenure, loads = self.tenure(p) if tenure is None else tenure, self._loads[p]
        if (saving := self._saving.get(p)) is not None and saving is not asyncio.current_task():
            await asyncio.shield(saving)
        if not self._unsaved[p] and not force:
            return
        try:
            if tenure is None or not await self.fence(p, tenure) or self._loads[p] != loads:
                log.info("partition %d not snapshotted: its lease or its state is not the one it was asked of", p)
                return
            self._unsaved[p], self._saved_at[p] = 0, asyncio.get_running_loop().time()
            snap = self.snapshot({p})  # at once: the lease was just confirmed
            size = await self.store.save(p, snap)
            self._snap_seq[p] = max(self._snap_seq.get(p, 0), snap.seq)
            self.saved_s = time.time()
            log.debug("snapshot of partition %d at seq %d: %d functions, %d bytes", p, snap.seq, len(snap.states), size)
        except Exception as e:  # a snapshot is an optimisation: never let it stop command handling
            self._failing.occurred(f"could not write the snapshot of partition {p}: {e}")
            return
        self._failing.ended()

    async def _keep_ahead(self) -> None:
        """Every second: snapshot the partitions whose snapshot retention is about to overtake (see _due)."""
        while True:
            await asyncio.sleep(self.guard_every_s)
            held = self.ledger.seq  # before the look: an append acked while it is under way is not in its answer
            try:
                at = await self.events.kept()
            except NotFoundError:  # the stream itself is gone (the store emptied under us)
                await self.lost(f"the {EVENTS} stream is gone")
                continue
            except Exception:  # NATS away: nothing is appended or dropped meanwhile either
                continue
            if at.stream_id != self.stream_id or at.last_seq < held:
                # Seen on two looks in a row: a cluster's new stream leader may answer a moment before it applied all.
                self._behind += 1
                if self._behind >= 2:
                    behind = "is another stream" if at.stream_id != self.stream_id else f"ends at seq {at.last_seq:,}"
                    await self.lost(f"{EVENTS} {behind}, but this node holds batches up to seq {held:,}")
                continue
            self._behind = 0
            self._seen = max(self._seen, at.last_seq)
            if self._retention_set and at.config is not None and (off := limits_off(at.config, self.retention)):
                await self._restore(off)
            if not self._retention_set:
                with contextlib.suppress(Exception):  # tried again at the next look
                    await self._apply_retention(at)
            if at.first_seq > self._first:  # functions whose every batch is gone: no order check to keep
                self._first = at.first_seq
                self.ledger.expire_before(at.first_seq)
            now = asyncio.get_running_loop().time()
            for p in sorted(self.serving):
                saving = self._saving.get(p)
                if (saving is None or saving.done()) and self._due(p, at, now):
                    self._saving[p] = asyncio.create_task(self.save(p, force=True))

    async def _restore(self, off: str) -> None:
        """EVENTS's limits changed behind the node's back: the batches they drop may be held by no snapshot yet, and a
        partition whose snapshot falls behind the stream's first batch could not be rebuilt. So every partition served
        is snapshotted at once (the state holds every batch), then the node's limits are put back."""
        log.error("%s's limits were changed behind this node's back (%s): snapshotting partitions %s and putting its"
                  " own back", EVENTS, off, ranges(sorted(self.serving)))  # fmt: skip
        await asyncio.gather(*(self.save(p, force=True) for p in sorted(self.serving)))
        with contextlib.suppress(Exception):  # NATS away: the next look finds them off still, and does it again
            await self.events.set_retention(self.retention)
            log.warning("%s keeps %gh and %g GB again", EVENTS, self.retention.max_age_s / 3600,
                        self.retention.max_bytes / 1e9)  # fmt: skip

    async def _apply_retention(self, at: Kept) -> None:
        """Bring the stream's limits to ours once every partition has a snapshot this version reads, in the newer
        half of what is kept. Lower limits drop old batches at once, and until then a partition without such a
        snapshot (an upgrade that changed the state's shape, a stream older than retention) needs them all."""
        if at.config is None or limits_off(at.config, self.retention):
            snaps = await asyncio.gather(*(self.store.load(p, at.stream_id, at.last_seq) for p in range(PARTITIONS)))
            newer_half = at.first_seq + (at.last_seq - at.first_seq) // 2
            if not all(snap is not None and snap.seq >= newer_half for snap in snaps):
                return
            await self.events.set_retention(self.retention)
            log.info("EVENTS now keeps %gh and %g GB", self.retention.max_age_s / 3600, self.retention.max_bytes / 1e9)
        self._retention_set = True

    def _due(self, p: int, at: Kept, now: float) -> bool:
        """Events unsaved for the snapshot interval (a partition that went quiet) or with no snapshot before them
        (its first, within a look of its first events), or a snapshot older than a quarter of the stream's age
        or, while retention may drop batches by size, in the older half of what the stream keeps: which a newer
        watermark would help."""
        saved_at, snap_seq = self._saved_at.get(p, now), self.claimed(p)
        if self._unsaved[p] and (now - saved_at >= self.interval_s or not snap_seq):
            return True
        if self.watermark({p}) <= snap_seq:
            return False
        if now - saved_at >= self.retention.max_age_s / 4:
            return True
        older_half = snap_seq < at.first_seq + (at.last_seq - at.first_seq) // 2
        return older_half and self._dropping(at)

    def _dropping(self, at: Kept) -> bool:
        """Whether the stream may soon drop batches by size: it dropped some, holds half its byte limit or more, or
        keeps limits not ours yet. A young stream far below its limit drops none (its age has a rule of its own),
        and snapshotting every partition each time it doubles would be a wave of writes every few seconds after
        a start, under the calls the node is serving."""
        if not self._retention_set or at.truncated:
            return True
        limit = self.retention.max_bytes
        return limit > 0 and 2 * at.bytes >= limit
