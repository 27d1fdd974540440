"""The controller's schedules without a node: its one timer, on a clock that moves only when told, and when
the snapshotter renews a partition's snapshot, given the time and what the stream keeps."""

import asyncio
from types import SimpleNamespace

from scaler.controller.path.timers import Timers
from scaler.controller.snapshotter import Snapshotter
from scaler.runtime.clock import Clock
from scaler.store import Kept, Retention
from tests.clocks import Stopped


class Polled(Stopped):
    """Stands still until `advance`; the timer's wait for the next deadline is a short poll, not the deadline's."""

    def real_s(self, trace_ms: float) -> float:
        return 0.001


class Fired:
    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail  # the first `fail` calls raise, as an append while the event store is away

    async def __call__(self, key: str, due: int) -> None:
        self.calls.append((key, due))
        if self.fail:
            self.fail -= 1
            raise ConnectionError("event store away")


async def settle(timers: Timers) -> None:
    """Let the timer's loop look at the clock, and what it fired finish."""
    for _ in range(5):
        await asyncio.sleep(0.01)
        if timers._firing:
            await asyncio.wait(timers._firing)


async def test_a_deadline_fires_once_when_due_and_not_before():
    clock, fired = Polled(1_000), Fired()
    timers = Timers(clock, fired)
    timers.start()
    try:
        timers.set("a", 1_500)
        timers.set("b", 3_000)
        clock.advance(499)
        await settle(timers)
        assert fired.calls == []
        clock.advance(1)
        await settle(timers)
        assert fired.calls == [("a", 1_500)] and timers.due == {"b": 3_000}
        clock.advance(10_000)
        await settle(timers)
        await settle(timers)
        assert fired.calls == [("a", 1_500), ("b", 3_000)] and timers.due == {}
    finally:
        await timers.stop()


async def test_a_deadline_replaced_or_cleared_before_it_is_due_does_not_fire():
    clock, fired = Polled(1_000), Fired()
    timers = Timers(clock, fired)
    timers.start()
    try:
        timers.set("a", 1_100)
        timers.set("a", 2_000)  # a later decision moved it
        timers.set("b", 1_100)
        timers.set("b", None)  # and this one needs no waking
        clock.advance(500)
        await settle(timers)
        assert fired.calls == []
        clock.advance(500)
        await settle(timers)
        assert fired.calls == [("a", 2_000)]
    finally:
        await timers.stop()


async def test_a_tick_that_fails_is_tried_again_unless_a_newer_deadline_came():
    clock, fired = Polled(1_000), Fired(fail=1)
    timers = Timers(clock, fired)
    timers.start()
    try:
        timers.set("a", 1_000)
        await asyncio.sleep(0.1)  # fired, failed, and waiting its second to try again
        assert fired.calls == [("a", 1_000)] and timers._failed == {"a"}
        await asyncio.sleep(1.2)  # a failed tick is tried again a second later
        await settle(timers)
        assert fired.calls == [("a", 1_000), ("a", 1_000)] and timers._failed == set()

        fired.fail = 1
        timers.set("b", 1_000)
        await asyncio.sleep(0.1)
        timers.set("b", 5_000)  # decided meanwhile: the failed tick is not put back over it
        await asyncio.sleep(1.2)
        await settle(timers)
        assert timers.due == {"b": 5_000} and fired.calls[-1] == ("b", 1_000)
    finally:
        await timers.stop()


# The snapshot schedule: when a partition's snapshot is due, given what the stream keeps and the time.


def snapshotter(ledger_seq: int) -> Snapshotter:
    ledger = SimpleNamespace(seq=ledger_seq, states={})
    return Snapshotter(
        events=None,
        store=None,
        ledger=ledger,
        clock=Clock(),
        retention=Retention(max_age_s=3600),
        serving={0},
        floor=lambda seq, partitions=None: seq,
        fence=None,
        tenure=None,
        lost=None,
        stream_id="s",
        interval_s=60,
    )


def test_a_partition_with_unsaved_events_is_snapshotted_once_the_interval_passed():
    snaps = snapshotter(ledger_seq=100)
    snaps._snap_seq[0], snaps._saved_at[0] = 100, 1_000.0
    kept = Kept(first_seq=1, last_seq=100, stream_id="s")
    assert not snaps._due(0, kept, now=1_059.0)  # nothing unsaved, and the snapshot is up to date
    snaps._unsaved[0] = 3
    assert not snaps._due(0, kept, now=1_059.0)
    assert snaps._due(0, kept, now=1_060.0)


def test_the_first_events_of_a_partition_with_no_snapshot_are_snapshotted_at_the_next_look():
    """No snapshot yet (a new stream): its first events are, without waiting for the interval; none before them."""
    snaps = snapshotter(ledger_seq=100)
    snaps._retention_set = True
    snaps._snap_seq[0], snaps._saved_at[0] = 0, 1_000.0  # loaded with no snapshot
    kept = Kept(first_seq=1, last_seq=100, stream_id="s", bytes=10**5)
    assert not snaps._due(0, kept, now=1_001.0)
    snaps._unsaved[0] = 1
    assert snaps._due(0, kept, now=1_001.0)
    snaps._snap_seq[0] = 90  # its first written: the interval again
    assert not snaps._due(0, kept, now=1_001.0)


def test_a_snapshot_retention_is_overtaking_is_renewed_once_the_watermark_moved():
    snaps = snapshotter(ledger_seq=400)
    snaps._retention_set = True
    snaps._snap_seq[0], snaps._saved_at[0] = 260, 1_000.0
    assert not snaps._due(0, Kept(first_seq=100, last_seq=400, stream_id="s"), now=1_001.0)  # newer half: 250 on
    assert snaps._due(0, Kept(first_seq=200, last_seq=400, stream_id="s"), now=1_001.0)  # older half: below 300
    snaps.ledger.seq = 260  # the watermark is the snapshot's own: a new one would not help
    assert not snaps._due(0, Kept(first_seq=200, last_seq=260, stream_id="s"), now=1_001.0)


def test_the_older_half_counts_only_once_retention_may_drop_batches_by_size():
    """A young stream far below its byte limit drops nothing: a snapshot in the older half of it is not renewed
    (else every partition's would be each time the stream doubles: 32 snapshots at 2, 5, 12, 26 and 54 s after a
    start, under the calls). Once it holds half its limit, or has dropped batches, or keeps limits not yet the
    node's (which waits for every snapshot in the newer half), it is."""
    snaps = snapshotter(ledger_seq=400)
    snaps._retention_set = True
    snaps._snap_seq[0], snaps._saved_at[0] = 100, 1_000.0
    young = Kept(first_seq=1, last_seq=400, stream_id="s", bytes=10**6)  # seq 100: the older half
    assert not snaps._due(0, young, now=1_001.0)
    assert snaps._due(0, young._replace(bytes=snaps.retention.max_bytes // 2), now=1_001.0)
    assert snaps._due(0, young._replace(first_seq=2), now=1_001.0)
    snaps._retention_set = False
    assert snaps._due(0, young, now=1_001.0)
    snaps._retention_set = True
    assert snaps._due(0, young, now=1_000.0 + 900)  # a quarter of the hour the stream keeps: whatever its size


def test_a_snapshot_older_than_a_quarter_of_the_stream_age_is_renewed():
    snaps = snapshotter(ledger_seq=400)
    snaps._snap_seq[0], snaps._saved_at[0] = 390, 1_000.0
    kept = Kept(first_seq=1, last_seq=400, stream_id="s")
    assert not snaps._due(0, kept, now=1_000.0 + 899)
    assert snaps._due(0, kept, now=1_000.0 + 900)  # a quarter of the hour the stream keeps


async def test_a_snapshot_asked_in_one_holding_of_the_lease_or_one_load_is_not_written_in_the_next():
    """A save waiting behind another save of its partition, while the lease was lost and taken again (the
    partition loading anew), writes nothing: its state would be the holding before's. One asked in the new
    holding is written. Nor one whose partition was reloaded meanwhile (a loss found in the stream)."""
    tenure, confirmed, written = [1], [], []

    async def fence(p: int, asked_in: int | None) -> bool:
        confirmed.append(asked_in)
        return asked_in == tenure[0]

    class Store:
        async def save(self, p: int, snap) -> int:
            written.append((p, snap.seq))
            return 0

    ledger = SimpleNamespace(seq=100, states={}, last_seq={}, features={}, wake={})
    snaps = Snapshotter(
        events=None, store=Store(), ledger=ledger, clock=Clock(), retention=Retention(max_age_s=3600), serving={0},
        floor=lambda seq, partitions=None: seq, fence=fence, tenure=lambda p: tenure[0], lost=None, stream_id="s",
    )  # fmt: skip
    gate = asyncio.Event()
    snaps._saving[0] = asyncio.create_task(gate.wait())  # a save of the partition under way
    asked = asyncio.create_task(snaps.save(0, force=True))
    await asyncio.sleep(0)
    tenure[0] = 2  # the lease lapsed and was taken again meanwhile
    gate.set()
    await asyncio.wait_for(asked, 5)
    assert written == [] and confirmed == [1]
    await snaps.save(0, force=True)
    assert written == [(0, 100)] and confirmed == [1, 2]
    gate = asyncio.Event()  # again, the partition reloaded (its state forgotten, loaded anew) within the holding
    snaps._saving[0] = asyncio.create_task(gate.wait())
    asked = asyncio.create_task(snaps.save(0, force=True))
    await asyncio.sleep(0)
    snaps.forget([0])
    gate.set()
    await asyncio.wait_for(asked, 5)
    assert written == [(0, 100)], "snapshotted a partition whose state was forgotten while the save waited"
