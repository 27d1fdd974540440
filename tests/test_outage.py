"""While the event store is away, every call that cannot be decided is UNAVAILABLE: a backlog that built up
behind the store is the store's, never overload (RESOURCE_EXHAUSTED is for a node that cannot keep up)."""

import asyncio
import io
import os
import signal
from collections import Counter

import grpc

from scaler import replay
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.events import Assigned
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from tests.processes import Parts
from tests.stack import Stack
from tests.test_crash import assign, frozen


async def test_calls_during_and_right_after_a_frozen_store_are_unavailable_never_overloaded(tmp_path):
    # Leases long enough that the node keeps its partitions through the outage: the backlog stays its own.
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url, lease_ttl_s=60) as stack:
        await stack.idle(await stack.assign("warm"))
        codes: Counter[str] = Counter()
        stop = asyncio.Event()

        async def one(n: int) -> None:
            meta = pb.Meta(key=f"fn{n % 8}", runtime="python", timeout_in_secs=60, memory_in_mb=128)
            try:
                await stack.scaler.Assign(pb.AssignRequest(request_id=f"r{n}", meta_data=meta), timeout=40)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as e:
                codes[e.code().name] += 1

        async def callers() -> None:
            calls, n = [], 0
            while not stop.is_set():
                calls.append(asyncio.create_task(one(n)))
                n += 1
                await asyncio.sleep(0.02)
            await asyncio.gather(*calls)

        load = asyncio.create_task(callers())
        await asyncio.sleep(1)
        os.kill(nats.proc.pid, signal.SIGSTOP)  # the store is away: no answer, no error
        try:
            await asyncio.sleep(12)
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        await asyncio.sleep(4)  # calls right after it came back, while the backlog it left drains
        stop.set()
        await load
        assert codes["OK"] > 0 and codes["RESOURCE_EXHAUSTED"] == 0, codes
        assert set(codes) <= {"OK", "UNAVAILABLE"}, codes


async def test_a_node_quick_to_refuse_as_overloaded_still_answers_a_frozen_store_unavailable(tmp_path):
    """NATS frozen for 3 s while calls keep coming, on a node that refuses as overloaded once 0.2 s behind (well
    before an append counts as slow by its own age): the backlog is still the store's, so no call is told
    RESOURCE_EXHAUSTED; each is served after the thaw or told UNAVAILABLE, and none is assigned twice."""
    stub = PlatformStub("127.0.0.1:0")
    await stub.start()
    args = ("--max-behind", "0.2")
    try:
        async with (
            NatsServer(tmp_path / "nats") as nats,
            Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=args) as parts,
        ):
            await assign(parts.gateway, "warm-up")

            async def call(n: int) -> str:
                try:
                    await assign(parts.gateway, f"r{n}", key=("fa", "fb", "fc")[n % 3])
                except grpc.aio.AioRpcError as e:
                    return f"{e.code().name}: {e.details()}"
                return "OK"

            calls = []
            frozen(nats.proc.pid)
            try:
                for n in range(60):  # one every 50 ms through the freeze
                    calls.append(asyncio.create_task(call(n)))
                    await asyncio.sleep(0.05)
            finally:
                nats.proc.send_signal(signal.SIGCONT)
            outcomes = Counter(o.split(":")[0] for o in await asyncio.gather(*calls))
            assert set(outcomes) <= {"OK", "UNAVAILABLE"}, outcomes
            async with connected(nats.url, "test") as nc:  # none released: each request assigned at most once
                assigned: Counter[str] = Counter()
                await replay.replay(
                    nc,
                    seen=lambda _, b: assigned.update(e.request_id for e in b.events if isinstance(e, Assigned)),
                )
                assert max(assigned.values()) == 1
                out = io.StringIO()
                assert await replay.verify(nc, None, out) == 0, out.getvalue()
    finally:
        await stub.stop()
