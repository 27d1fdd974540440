"""Retention: EVENTS drops its oldest batches, and every partition's state is still rebuilt exactly (from its
snapshot), by the controller's start and by `scaler replay`; or refused, clearly, when it cannot be."""

import asyncio
import logging
import sys

from scaler import replay
from scaler.controller import rebuild, snapshots
from scaler.controller.leases import EVERY_S
from scaler.controller.metrics import ControllerCollector
from scaler.controller.shell import Controller
from scaler.controller.snapshots import SnapshotStore
from scaler.proto.commands import Assign, Code
from scaler.proto.events import Meta
from scaler.proto.subjects import EVENTS, PARTITIONS, function_events, partition
from scaler.runtime.bus import connected
from scaler.store import stream
from scaler.store.config import DEFAULT_RETENTION, Retention, ensure_stream, set_retention
from tests.controller.test_snapshots import DEMO
from tests.nemesis import tear_snapshot
from tests.replay.test_replay import scaler_replay
from tests.stack import Stack

TINY = Retention(max_age_s=3600, max_bytes=128_000)  # a few hundred batches


def keys(n: int) -> list[str]:
    return [f"fn{i}" for i in range(n)]


async def rounds(stack: Stack, n: int, functions: list[str], tag: str = "r") -> None:
    """One request after another (a rate the tests' guard keeps up with on any machine), each function in turn."""
    for i in range(n):
        reply = await stack.assign(f"{tag}{i}", key=functions[i % len(functions)])
        await stack.idle(reply)


async def kept(nats_url: str) -> rebuild.Kept:
    async with connected(nats_url, "test") as nc:
        return await stream.kept(nc.jetstream())


async def truncated_stack(nats_url: str, stack: Stack, n: int = 400) -> None:
    """Enough traffic over 40 functions that the stream has dropped many batches."""
    await rounds(stack, n, keys(40))
    await stack.settled()
    at = await kept(nats_url)
    assert at.first_seq > 200, f"the test needs the stream truncated well past the start: {at}"


def tiny_stack(nats_url: str) -> Stack:
    return Stack(nats_url, retention=TINY, guard_every_s=0.05)


async def test_a_node_sets_the_retention_and_a_worker_leaves_it(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)  # a worker first: the default retention
        config = (await js.stream_info(EVENTS)).config
        assert (config.max_age, config.max_bytes, config.discard) == (24 * 3600, 10 * 10**9, "old")
        await ensure_stream(js, retention=TINY)  # a node starting: an existing stream's limits are left for later
        assert (await js.stream_info(EVENTS)).config.max_bytes == DEFAULT_RETENTION.max_bytes
        assert await set_retention(js, TINY)  # ... when every partition has a snapshot
        await ensure_stream(js)  # a worker again: leaves it
        config = (await js.stream_info(EVENTS)).config
        assert (config.max_age, config.max_bytes) == (TINY.max_age_s, TINY.max_bytes)
        assert not await set_retention(js, TINY)


async def test_bad_retention_flags_are_refused_before_anything_starts():
    for flag, value, message in [
        ("--store-limit-gb", "0.001", "must be at least 0.004"),
        ("--retention-hours", "0", "must be at least 0.0167"),
        ("--retention-hours", "soon", "not a number"),
    ]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scaler", "node", flag, value, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        assert proc.returncode == 2 and message in err.decode(), err.decode()


async def test_snapshots_stay_ahead_of_a_tiny_store_and_a_restart_is_exact(nats_url):
    async with tiny_stack(nats_url) as stack:
        await truncated_stack(nats_url, stack)
        before = dict(stack.controller.states)
        # Every partition's snapshot reaches back past the first batch kept, the idle ones too.
        async with connected(nats_url, "test") as nc:
            js = nc.jetstream()
            store = SnapshotStore(js)
            await store.open()
            at = await stream.kept(js)
            found = await rebuild.snapshots(store, at, range(PARTITIONS))
            assert all(snap is not None and snap.seq + 1 >= at.first_seq for snap in found.values())
    restarted = Controller(nats_url, DEMO, retention=TINY)
    await restarted.start()
    try:
        assert restarted.states == before
        assert sum(f.arrivals for f in restarted.ledger.features.values()) == 400
    finally:
        await restarted.stop()


async def test_a_function_whose_batches_retention_dropped_goes_on(nats_url):
    """Its next append expects what the stream still holds of it (nothing), not its last batch: no conflicts."""
    async with Stack(nats_url, retention=TINY, guard_every_s=3600) as stack:  # no guard: the append finds it out
        await rounds(stack, 1, ["old"], tag="o")
        await rounds(stack, 400, keys(40))
        async with connected(nats_url, "test") as nc:
            js = nc.jetstream()
            assert await stream.last_seq(js, function_events("old")) == 0
        await rounds(stack, 1, ["old"], tag="o-again")
        assert stack.controller.ledger.features_of("old").arrivals == 2


async def test_replay_starts_from_the_snapshots_once_the_stream_is_truncated(nats_url):
    async with tiny_stack(nats_url) as stack:
        await truncated_stack(nats_url, stack)
        async with connected(nats_url, "test") as nc:
            replayed = await replay.replay(nc)
        assert replayed.states == stack.controller.states
        code, out, err = await scaler_replay("--nats", nats_url, "--verify")
        assert code == 0 and "verified: 40 functions equal" in out, out + err
        code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn7")
        assert code == 0, err
        assert "timeline of fn7 (from its partition's snapshot at seq " in out
        assert "retention dropped EVENTS before seq " in out and "arrivals 10," in out
        code, out, err = await scaler_replay("--nats", nats_url)
        assert code == 0 and "40 functions from " in out and "(from each partition's snapshot, the newest at" in out
        for args in (["--until-seq", "5"], ["--until", "1000"]):
            code, _, err = await scaler_replay("--nats", nats_url, *args)
            assert code == 2 and "is before what can be rebuilt: retention dropped EVENTS before seq" in err, err
            assert err.count("\n") == 1 and "Traceback" not in err


async def test_a_partition_no_snapshot_covers_is_refused_once_and_the_others_served(nats_url, caplog):
    """Retention cut the stream; one partition's snapshot is gone, another's torn (a write cut short). Neither can
    be rebuilt exactly: the node says so once, keeps refusing them (each call told why, none loaded again every
    lease round), and serves every other partition as before."""
    async with tiny_stack(nats_url) as stack:
        await truncated_stack(nats_url, stack)
        before = dict(stack.controller.states)
    lost, torn = partition("fn3"), next(p for k in keys(40) if (p := partition(k)) != partition("fn3"))
    async with connected(nats_url, "test") as nc:
        store = SnapshotStore(nc.jetstream())
        await store.open()
        await store._store.delete(snapshots.name(lost))
        await tear_snapshot(nc.jetstream(), torn)
    controller = Controller(nats_url, DEMO, retention=TINY)
    with caplog.at_level(logging.INFO, logger="scaler.controller"):
        try:
            ready = await controller.start()
            assert f"{PARTITIONS - 2} of {PARTITIONS} partitions, REFUSING partitions" in ready, ready
            await asyncio.sleep(3 * EVERY_S)  # lease rounds: the refused partitions are not loaded again
            refused = {partition(k) for k in before} & {lost, torn}
            assert set(controller.partitions.refused) == {lost, torn} == refused
            assert not controller.partitions.loading, "the refused are not loading: their load ended"
            assert controller.trouble().startswith(f"the controller refuses partitions {min(lost, torn)}")
            exported = {m.name: m.samples[0].value for m in ControllerCollector(controller).collect() if m.samples}
            assert exported["scaler_partitions_refused"] == 2
            assert controller.states == {k: s for k, s in before.items() if partition(k) not in refused}
            key = next(k for k in before if partition(k) == lost)
            reply = await controller.call(Assign(key=key, request_id="late", meta=Meta(memory_mb=128)), 10)
            assert reply.code is Code.FAILED_PRECONDITION, reply
            assert f"refuses partition {lost}: " in reply.message and "cannot be rebuilt exactly" in reply.message
        finally:
            await controller.stop()
    said = [r.getMessage() for r in caplog.records if "cannot be rebuilt exactly" in r.getMessage()]
    assert len(said) == 1 and f"refuses partitions {min(lost, torn)}" in said[0], said
    code, _, err = await scaler_replay("--nats", nats_url)
    expected = "cannot be rebuilt exactly: retention dropped EVENTS before seq "
    assert code == 2 and expected in err and "it has no usable snapshot" in err, err


async def test_a_stream_older_than_the_retention_is_cut_only_once_snapshots_hold_it(nats_url):
    """An upgrade: a stream written without limits and no snapshot this version reads (deleted here). Applying
    a small limit at start would drop batches only a full replay holds: the node replays, snapshots, then cuts."""
    async with Stack(nats_url, retention=Retention(max_age_s=0, max_bytes=-1)) as stack:  # no limits, as before
        await rounds(stack, 400, keys(40))
        await stack.settled()
        before = dict(stack.controller.states)
    async with connected(nats_url, "test") as nc:
        await nc.jetstream().delete_object_store(snapshots.BUCKET)
    upgraded = Controller(nats_url, DEMO, retention=TINY, guard_every_s=0.05)
    await upgraded.start()
    try:
        assert upgraded.states == before
        async with connected(nats_url, "test") as nc:
            js = nc.jetstream()

            for _ in range(600):  # 30 s
                if (await js.stream_info(EVENTS)).config.max_bytes == TINY.max_bytes:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the node never set its retention on the stream")
    finally:
        await upgraded.stop()
    assert (await kept(nats_url)).first_seq > 200, "the limit dropped most of the stream"
    again = Controller(nats_url, DEMO, retention=TINY)
    await again.start()
    try:
        assert again.states == before
    finally:
        await again.stop()
