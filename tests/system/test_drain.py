"""A drained node on real processes: two nodes under load, one stopped as on SIGTERM, no call refused."""

import asyncio
import contextlib
import re
import time

import grpc

from scaler.cli.node import Node
from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.gateway.owed import Owed
from scaler.gateway.server import Gateway
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.events import Assigned
from scaler.proto.subjects import PARTITIONS
from tests.controller.path.test_lanes import Held
from tests.gateway.test_admin import scaler
from tests.processes import Driver, Parts
from tests.stack import Stack, eventually
from tests.system.test_nodes import KEYS, check, shared_between


async def test_a_drained_node_hands_its_partitions_over_and_refuses_nothing(nats_url):
    async with Stack(nats_url) as stack:  # node a, with the workers and the platform
        a = stack.controller
        b = Controller(nats_url, get_policy("demo"))
        gateway = Gateway(b, "127.0.0.1:0", reply_timeout_s=30)
        leaving = Node(b, gateway, [b, gateway])
        await leaving.start()
        await shared_between(nats_url, 2)
        staying_load = Driver(f"127.0.0.1:{stack.gateway.port}", keys=KEYS, clients=6, tag="s")
        # The leaving node's callers hold each instance a while: at the stop some are mid-request, and they
        # hold it until the leaving node handed every partition over; their Idle then goes to it.
        handed = asyncio.Event()
        leaving_load = Driver(f"127.0.0.1:{gateway.port}", keys=KEYS, clients=6, tag="l", hold_s=0.5, release=handed)
        handed_at: list[float] = []
        drain = b.drain

        async def timed_drain() -> str:
            try:
                said = await drain()
                handed_at.append(time.monotonic())
                return said
            finally:
                handed.set()

        b.drain = timed_drain
        loads = [asyncio.create_task(d.run()) for d in (staying_load, leaving_load)]
        await eventually(
            lambda: all({c.key for c in d.calls if c.idle_at} == set(KEYS) for d in (staying_load, leaving_load)), 30
        )
        loaded = a.loaded_batches
        # Stopped while a caller holds an instance (no await in between: it still holds it at the stop).
        await eventually(lambda: any(c.got_at and not c.idle_at for c in leaving_load.calls), 30)
        leaving_load.stop()  # its callers send no new Assign (as a load balancer stops routing to it)
        await leaving.stop()  # SIGTERM's way: drain, then the gateway and the controller stop
        await eventually(lambda: a.serving == set(range(PARTITIONS)), 30)
        drained = len(staying_load.calls)
        await eventually(lambda: len(staying_load.calls) > drained + 30, 30)
        staying_load.stop()
        await asyncio.gather(*loads)

        calls = staying_load.calls + leaving_load.calls
        assert [(c.request_id, c.error, c.retries) for c in calls if c.error or c.retries] == []
        assert sum(1 for c in leaving_load.calls if c.idle_at) > 0
        late = [c for c in leaving_load.calls if c.idle_at > handed_at[0]]
        assert late, "no Idle came to the leaving node after its hand-over: the test did not reach that case"
        # Node a took the partitions over from the snapshots node b wrote: no batch of them was read after.
        assert a.loaded_batches == loaded
        await stack.settled()
        await check(nats_url, stack.stub, calls)


async def test_scaler_drain_hands_a_running_nodes_partitions_over_and_stops_it(nats_url):
    platform = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await platform.start()
    try:
        async with Parts(nats_url, f"127.0.0.1:{platform.port}", nodes=2) as parts:
            await shared_between(nats_url, 2)
            load = Driver(parts.address("node"), keys=KEYS, clients=4, tag="s")
            running = asyncio.create_task(load.run())
            await eventually(lambda: {c.key for c in load.calls if c.idle_at} == set(KEYS), 30)
            code, out, err = await scaler("drain", "--gateway", parts.address("node-1"))
            assert code == 0, err
            assert re.fullmatch(r"\S+ handed partitions 0-15 to \S+\n|\S+ handed partitions 16-31 to \S+\n", out), out
            async with asyncio.timeout(30):
                assert await parts.running["node-1"].proc.wait() == 0  # then it stopped, as on SIGTERM
            held = await shared_between(nats_url, 1, seconds=5)  # already: the drain waited for the take-over
            drained = len(load.calls)
            await eventually(lambda: len(load.calls) > drained + 20, 30)
            load.stop()
            await running
            assert [(c.request_id, c.error, c.retries) for c in load.calls if c.error or c.retries] == []
            assert sum(held.values()) == PARTITIONS
            await check(nats_url, platform, load.calls)
    finally:
        await platform.stop()


async def test_the_requests_a_gateway_waits_for_stay_few():
    """An Idle may go to another node and never come back here: the oldest are forgotten past a count or an age."""
    owed = Owed(forget_s=60, most=3)
    for request in "abcd":
        owed.assigned(request)
    owed.returned("c")
    assert len(owed) == 2, "a forgotten past the count, c returned"
    waiting = asyncio.create_task(owed.settled(30))
    asyncio.get_running_loop().call_later(0.2, owed.returned, "b")
    asyncio.get_running_loop().call_later(0.4, owed.returned, "d")
    assert await waiting == 0
    aged = Owed(forget_s=0.05)
    aged.assigned("old")
    await asyncio.sleep(0.1)
    aged.assigned("new")
    assert len(aged) == 1 and await aged.settled(0.1) == 1, "old forgotten past its age; new never returned"


async def test_a_gateway_owes_an_assign_from_its_call_until_its_idle(nats_url):
    """A node stopping after its drain waits for what its gateway owes: an Assign still under way at the stop
    is answered meanwhile, and its caller's Idle must find the gateway open."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("warm"))
        await stack.settled()
        held = Held(stack, Assigned)
        assigning = asyncio.create_task(stack.assign("r1"))
        await held.reached.wait()
        owed = stack.gateway.owed
        assert await owed.settled(0.2) == 1, "an Assign under way is not owed"
        held.release()
        reply = await assigning
        assert await owed.settled(0.2) == 1, "an instance handed out is owed until its Idle"
        await stack.idle(reply)
        assert await owed.settled(0.2) == 0
        refused = pb.AssignRequest(request_id="r2", meta_data=pb.Meta(key="fn", memory_in_mb=0))
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stack.scaler.Assign(refused, timeout=30)
        # Its caller can hear the refusal before the gateway's handler has run on past it (one loop, loaded machine).
        assert await owed.settled(5) == 0, "a refused Assign is owed nothing"
