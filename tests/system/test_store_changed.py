"""The EVENTS stream changed under a running node: deleted, or its limits cut behind the node's back. The node
notices, says so, serves again and leaks nothing; what it holds stays loadable."""

import asyncio

import grpc

from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.proto.subjects import EVENTS, PARTITIONS
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.store.config import limits_off
from tests.invariants import snapshots_hold_what_they_claim
from tests.stack import Stack, eventually


async def served_again(stack: Stack, request_id: str, key: str, seconds: float = 60):
    """The Assign, repeated as a platform does while it is refused UNAVAILABLE, until it is served."""
    async with asyncio.timeout(seconds):
        while True:
            try:
                return await stack.assign(request_id, key)
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                await asyncio.sleep(0.25)


async def test_a_stream_deleted_under_the_node_is_made_again_served_and_its_slots_retired(tmp_path):
    """Against a platform that cannot list its slots (the challenge's): the slots the node held when EVENTS was
    deleted are unknown to the new stream, and only the node's memory of them can have them destroyed. The
    workers' consumers went with the stream: they are made again, or no cold start would ever be served."""
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url, like_challenge=True) as stack:
        for key in ("fa", "fb", "fc"):
            await stack.idle(await stack.assign(f"warm-{key}", key))
        await stack.settled()
        before = set(stack.stub.accounting.live)
        assert len(before) == 3
        async with connected(nats.url, "test") as nc:
            await nc.jetstream().delete_stream(EVENTS)
        reply = await served_again(stack, "after", "fa")  # a cold start: the new stream knows no instance
        await stack.idle(reply)
        await stack.settled()
        await eventually(lambda: not before & set(stack.stub.accounting.live), seconds=30)  # retired, destroyed
        assert set(stack.stub.accounting.live) == {
            i.slot_id for s in stack.controller.states.values() for i in s.instances.values() if i.slot_id
        }


async def test_limits_cut_behind_the_nodes_back_are_put_back_and_the_partitions_snapshotted(tmp_path):
    """EVENTS cut to 5 s and 50 batches: the batches it drops are held by no snapshot yet, so the node snapshots
    every partition at once and puts its own limits back; a fresh node then loads every partition exactly."""
    async with NatsServer(tmp_path / "nats") as nats:
        async with Stack(nats.url) as stack:
            for n in range(40):
                await stack.idle(await stack.assign(f"r{n}", f"fn{n % 8}"))
            await stack.settled()
            await eventually(lambda: stack.controller.snapshots._retention_set)  # its own limits are set
            async with connected(nats.url, "test") as nc:
                js = nc.jetstream()
                config = (await js.stream_info(EVENTS)).config
                config.max_age, config.max_msgs, config.duplicate_window = 5.0, 50, 5.0
                await js.update_stream(config)

                async def put_back() -> bool:
                    return not limits_off((await js.stream_info(EVENTS)).config, stack.controller.settings.retention)

                for _ in range(150):
                    if await put_back():
                        break
                    await asyncio.sleep(0.2)
                else:
                    raise AssertionError("EVENTS's limits were left cut")
                for n in range(10):
                    await stack.idle(await stack.assign(f"s{n}", f"fn{n % 8}"))
                await stack.settled()
                assert await snapshots_hold_what_they_claim(js) == []
        fresh = Controller(nats.url, get_policy("demo"), node="fresh")
        try:
            await fresh.start()
            assert len(fresh.serving) == PARTITIONS and not fresh.partitions.refused
            assert fresh.trouble() == ""
            await nats.stop()
            await eventually(lambda: fresh.trouble() != "")  # NATS away: the node says it cannot serve
        finally:
            await nats.start()
            await fresh.stop()
