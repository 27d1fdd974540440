"""Snapshots only make starts and take-overs faster: a start from any snapshot gives the state a full replay gives."""

import asyncio
import re

import pytest

from scaler.controller import snapshots
from scaler.controller.core import features, state
from scaler.controller.core.features import FnStats
from scaler.controller.core.policy import get_policy
from scaler.controller.core.state import FnState
from scaler.controller.ledger import Ledger
from scaler.controller.shell import Controller
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.proto.commands import Assign
from scaler.proto.events import Meta
from scaler.proto.subjects import event_subject, function_events, partition, partition_events
from scaler.runtime.bus import connected
from scaler.store import stream
from scaler.store.config import ensure_stream
from tests.stack import Stack

DEMO = get_policy("demo")


async def full_fold(nats_url: str) -> tuple[dict[str, FnState], dict[str, FnStats]]:
    """Every function's state and features, folded from the whole stream."""
    async with connected(nats_url, "test") as nc:
        ledger = Ledger()
        await stream.read(nc.jetstream(), ledger.fold)
        return ledger.states, ledger.features


async def full_replay(nats_url: str) -> dict[str, FnState]:
    return (await full_fold(nats_url))[0]


async def some_traffic(stack: Stack, tag: str, n: int = 12) -> None:
    replies = await asyncio.gather(*(stack.assign(f"{tag}{i}", key=f"fn{i % 4}") for i in range(n)))
    await asyncio.gather(*(stack.idle(r, need_destroy=i % 3 == 0) for i, r in enumerate(replies)))
    await stack.settled()


async def test_a_start_loads_the_snapshots_and_replays_only_what_follows(nats_url):
    async with Stack(nats_url) as stack:
        await some_traffic(stack, "a")
    # Stopping gave every partition back, each snapshotted: a start reads no batch at all.
    restarted = Controller(nats_url, DEMO)
    description = await restarted.start()
    try:
        assert restarted.loaded_batches == 0 and "0 batches read" in description
        assert (restarted.states, restarted.ledger.features) == await full_fold(nats_url)
        # Traffic after the snapshots: the next start folds just that on top of them.
        await restarted.call(stack_assign("late", "fn0"), 10)
    finally:
        await restarted.stop()
    again = Controller(nats_url, DEMO)
    await again.start()
    try:
        assert (again.states, again.ledger.features) == await full_fold(nats_url)
        assert sum(f.arrivals for f in again.ledger.features.values()) == 13
    finally:
        await again.stop()


def stack_assign(request_id: str, key: str) -> Assign:
    return Assign(key=key, request_id=request_id, meta=Meta(memory_mb=256, runtime="python", timeout_s=60))


async def test_a_snapshot_taken_during_an_append_does_not_claim_it(nats_url):
    """The watermark stays below a batch that is stored but not yet applied, whatever came after it."""
    async with Stack(nats_url) as stack:
        controller = stack.controller
        gate = asyncio.Event()
        appended = asyncio.Event()
        original = controller.writer.store.append

        async def slow_for_one_key(a):
            seq = await original(a)
            if a.key_subjects == function_events("slow"):
                appended.set()
                await gate.wait()
            return seq

        controller.writer.store.append = slow_for_one_key
        slow = asyncio.create_task(stack.assign("s1", key="slow"))
        await appended.wait()
        await stack.assign("f1", key="fast")  # appended after the slow one, and applied
        snap = controller.snapshot()
        slow_seq = await stream.last_seq(controller.writer.store.js, function_events("slow"))
        assert controller.ledger.seq > slow_seq
        assert snap.seq < slow_seq and "slow" not in snap.states
        gate.set()
        await slow
        assert controller.snapshot().seq >= await stream.last_seq(controller.writer.store.js)


async def test_every_snapshot_taken_under_load_restores_the_replayed_state(nats_url):
    taken: list[tuple[int, Snapshot]] = []
    async with Stack(nats_url) as stack:
        stack.controller.snapshots.every = 1  # a snapshot after every append that finds none being written
        save = stack.controller.snapshots.store.save

        async def keep(p: int, snap: Snapshot) -> int:
            taken.append((p, snap))
            return await save(p, snap)

        stack.controller.snapshots.store.save = keep
        await some_traffic(stack, "a", n=40)
    expected, learned = await full_fold(nats_url)
    assert len(taken) > 3
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        for p, snap in taken:
            ledger = Ledger()
            ledger.restore(snap.states, snap.features, snap.last_seq, snap.wake, snap.seq)
            await stream.read(js, ledger.fold, partition_events(p), after_seq=snap.seq)
            mine = {k: s for k, s in expected.items() if partition(k) == p}
            assert ledger.states == mine, f"the snapshot of partition {p} at seq {snap.seq} restores another state"
            assert ledger.features == {k: f for k, f in learned.items() if partition(k) == p}, "other features"


async def test_only_a_snapshot_known_to_fit_is_used(nats_url, monkeypatch):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        learned = {"fn": FnStats(arrivals=3, gaps=(10, 20))}  # the features' body, beside the states'
        snap = Snapshot(
            seq=5, stream=await stream.stream_id(js), last_seq={}, states={"fn": FnState(key="fn")}, features=learned
        )
        store = SnapshotStore(js)
        await store.open()
        await store.save(3, snap)
        assert await store.load(3, snap.stream, 5) == snap
        assert await store.load(4, snap.stream, 5) is None, "another partition's"
        assert await store.load(3, snap.stream, 4) is None, "ahead of the stream: the store was reset"
        assert await store.load(3, "another stream", 5) is None
        monkeypatch.setattr(state, "VERSION", state.VERSION - 1)
        assert await store.load(3, snap.stream, 5) is None, "a newer version's (a downgrade): never misread"
        monkeypatch.undo()
        monkeypatch.setattr(features, "VERSION", features.VERSION + 1)
        assert await store.load(3, snap.stream, 5) is None, "features folded by other rules: read from the stream"
        monkeypatch.undo()
        await store._store.put(snapshots.name(3), b"\xc1 not a snapshot")
        assert await store.load(3, snap.stream, 5) is None, "unreadable: the partition is read from the stream"


class _StatsV9(FnStats, kw_only=True):
    """Features version 9's stats: today's, and the slot time the lifecycle keeps since version 10."""

    slot_gb_ms: float = 0.0
    slot_at_ms: int = 0
    slot_mb: int = 0


async def test_a_snapshot_whose_features_held_the_slot_time_carries_on_with_the_rest_of_them(nats_url, monkeypatch):
    """Features version 9 folded each function's slot time, which the totals now sum from the lifecycle: its
    snapshots are not read from the stream again, their other features carry on, the slot time is left out."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        sid = await stream.stream_id(js)
        kept = {"arrivals": 3, "gaps": (10, 20), "exec_ms": 250.0}
        old = {"fn": _StatsV9(**kept, slot_gb_ms=900.0, slot_at_ms=40, slot_mb=512)}
        store = SnapshotStore(js)
        await store.open()
        monkeypatch.setattr(features, "VERSION", 9)
        await store.save(3, Snapshot(seq=5, stream=sid, last_seq={}, states={"fn": FnState(key="fn")}, features=old))
        monkeypatch.undo()
        loaded = await store.load(3, sid, 5)
        assert loaded is not None and loaded.features == {"fn": FnStats(**kept)}


async def test_a_snapshot_replaced_while_it_is_read_is_read_again(nats_url, monkeypatch):
    """Its owner snapshots the partition again while another reads it (an invariant check, a take-over): the old
    object's chunks go, and the reader, waiting for them, would stall."""
    monkeypatch.setattr(snapshots, "READ_S", 0.5)
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        sid = await stream.stream_id(js)
        old, new = (Snapshot(seq=seq, stream=sid, last_seq={}, states={}) for seq in (4, 5))
        store = SnapshotStore(js)
        await store.open()
        await store.save(3, old)
        get = store._store.get
        reads = []

        async def replaced_under_the_read(name, **kw):
            reads.append(name)
            if len(reads) == 1:
                await store.save(3, new)
                await asyncio.Event().wait()  # the old chunks gone: never delivered
            return await get(name, **kw)

        store._store.get = replaced_under_the_read
        assert await store.load(3, sid, 5) == new
        assert len(reads) == 2


async def test_an_unreadable_batch_stops_the_start_with_its_sequence(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        await js.publish(event_subject("fn"), b"\x93not a batch")
    controller = Controller(nats_url, DEMO)
    with pytest.raises(stream.UnreadableStream, match=rf"seq 1 on {re.escape(event_subject('fn'))}"):
        await controller.start()
    await controller.stop()
