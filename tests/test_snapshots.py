"""Snapshots only make starts faster: a start from any snapshot gives exactly the state a full replay gives."""

import asyncio
import inspect

import msgspec
import pytest

from controller import snapshots, stream
from controller.core import features
from controller.core.policy import get_policy
from controller.core.state import FnState, apply
from controller.shell import Controller
from controller.snapshots import Snapshot, SnapshotStore
from runtime.bus import connected, ensure_streams
from tests.stack import Stack

DEMO = get_policy("demo")


def folder(states: dict[str, FnState], last: dict[str, int]):
    """What a restore does with each batch after the snapshot: fold it unless the state has it."""

    def fold(seq, batch):
        if seq > last.get(batch.key, 0):
            s = states.get(batch.key) or FnState(key=batch.key)
            for e in batch.events:
                s = apply(s, e)
            states[batch.key], last[batch.key] = s, seq

    return fold


async def full_replay(nats_url: str) -> dict[str, FnState]:
    async with connected(nats_url, "test") as nc:
        states: dict[str, FnState] = {}
        await stream.read(nc.jetstream(), folder(states, {}))
        return states


async def some_traffic(stack: Stack, tag: str, n: int = 12) -> None:
    replies = await asyncio.gather(*(stack.assign(f"{tag}{i}", key=f"fn{i % 4}") for i in range(n)))
    await asyncio.gather(*(stack.idle(r, need_destroy=i % 3 == 0) for i, r in enumerate(replies)))
    await stack.settled()


async def test_a_start_loads_the_snapshot_and_replays_only_what_follows(nats_url, tmp_path):
    path = str(tmp_path / "controller.sqlite")
    async with Stack(nats_url, snapshots=path) as stack:
        await some_traffic(stack, "a")
    # Stopping wrote a snapshot of everything: a start reads no batch at all.
    restarted = Controller(nats_url, DEMO, snapshots=path)
    description = await restarted.start()
    try:
        assert restarted.rebuilt_from > 0 and "snapshot at seq" in description and " + 0 batches" in description
        assert restarted.states == await full_replay(nats_url)
    finally:
        await restarted.stop()

    # Batches written without the snapshot store (an older run) are folded on top of the snapshot.
    async with Stack(nats_url) as stack:
        await some_traffic(stack, "b")
    again = Controller(nats_url, DEMO, snapshots=path)
    await again.start()
    try:
        assert again.rebuilt_from > 0
        assert again.states == await full_replay(nats_url)
        assert sum(s.stats.arrivals for s in again.states.values()) == 24
    finally:
        await again.stop()


async def test_a_snapshot_taken_during_an_append_does_not_claim_it(nats_url, tmp_path):
    """The watermark stays below a batch that is stored but not yet applied, whatever came after it."""
    async with Stack(nats_url) as stack:
        controller = stack.controller
        gate = asyncio.Event()
        appended = asyncio.Event()
        original = controller._append

        async def slow_for_one_key(batch):
            seq = await original(batch)
            if batch.key == "slow":
                appended.set()
                await gate.wait()
            return seq

        controller._append = slow_for_one_key
        slow = asyncio.create_task(stack.assign("s1", key="slow"))
        await appended.wait()
        await stack.assign("f1", key="fast")  # appended after the slow one, and applied
        snap = controller.snapshot()
        slow_seq = await stream.last_seq(controller._js, "evt.slow")
        assert controller.applied_seq > slow_seq
        assert snap.seq < slow_seq and "slow" not in snap.states
        gate.set()
        await slow
        assert controller.snapshot().seq >= await stream.last_seq(controller._js)


async def test_every_snapshot_taken_under_load_restores_the_replayed_state(nats_url, tmp_path):
    path = tmp_path / "controller.sqlite"
    async with Stack(nats_url, snapshots=str(path)) as stack:
        stack.controller._snapshot_every = 1  # a snapshot after every append that finds none being written
        stack.controller._store.keep = 10_000
        await some_traffic(stack, "a", n=40)
    expected = await full_replay(nats_url)
    store = SnapshotStore(path)
    await store.open()
    async with store._db.execute("SELECT body FROM snapshots") as rows:
        taken = [msgspec.msgpack.decode(body, type=Snapshot) async for (body,) in rows]
    await store.close()
    assert len(taken) > 3
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        for snap in taken:
            states = dict(snap.states)
            await stream.read(js, folder(states, dict(snap.last_seq)), after_seq=snap.seq)
            assert states == expected, f"the snapshot at seq {snap.seq} restores another state"


async def snapshot_of(nats_url: str, seq: int = 1) -> Snapshot:
    async with connected(nats_url, "test") as nc:
        await ensure_streams(nc.jetstream())
        return Snapshot(seq=seq, stream=await stream.stream_id(nc.jetstream()), last_seq={}, states={})


async def test_only_a_snapshot_known_to_fit_is_used(nats_url, tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path / "s.sqlite")
    await store.open()
    try:
        snap = await snapshot_of(nats_url, seq=5)
        await store.save(snap)
        assert await store.load(snap.stream, 5) == snap
        assert await store.load(snap.stream, 4) is None, "ahead of the stream: the store was reset"
        assert await store.load("another stream", 5) is None
        monkeypatch.setattr(snapshots, "SHAPE", "changed")
        assert await store.load(snap.stream, 5) is None, "another state shape: never misread"
        monkeypatch.undo()
        await store._db.execute(
            "INSERT INTO snapshots (shape, stream, seq, body) VALUES (?, ?, 5, x'c1')", (snapshots.SHAPE, snap.stream)
        )
        assert await store.load(snap.stream, 5) == snap, "an unreadable newest one falls back to the one before"
        for _ in range(5):
            await store.save(snap)
        async with store._db.execute("SELECT count(*) FROM snapshots") as rows:
            assert (await rows.fetchone())[0] == snapshots.KEEP
    finally:
        await store.close()


def test_the_stamp_changes_with_the_schema_the_lifecycle_fold_and_the_features_version(monkeypatch):
    now = snapshots.current_shape()
    assert len(now) == 16 and now == snapshots.SHAPE
    real_source = inspect.getsource

    def edited(module_name: str):
        return lambda obj: real_source(obj) + ("# edited\n" if obj.__name__ == module_name else "")

    monkeypatch.setattr(inspect, "getsource", edited("controller.core.features"))
    assert snapshots.current_shape() == now, "tidying the features fold keeps snapshots"
    monkeypatch.setattr(inspect, "getsource", edited("controller.core.state"))
    assert snapshots.current_shape() != now, "any edit of the lifecycle fold discards them"
    monkeypatch.undo()
    monkeypatch.setattr(features, "VERSION", features.VERSION + 1)
    assert snapshots.current_shape() != now, "features that compute something else discard them"
    monkeypatch.undo()
    schema = msgspec.json.schema
    monkeypatch.setattr(msgspec.json, "schema", lambda t: {**schema(t), "extra": 1})
    assert snapshots.current_shape() != now, "another schema discards them"


async def test_an_unreadable_batch_stops_the_start_with_its_sequence(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_streams(js)
        await js.publish("evt.fn", b"\x93not a batch")
    controller = Controller(nats_url, DEMO)
    with pytest.raises(stream.UnreadableStream, match=r"seq 1 on evt\.fn"):
        await controller.start()
    await controller.stop()
