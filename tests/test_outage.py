"""While the event store is away, every call that cannot be decided is UNAVAILABLE: a backlog that built up
behind the store is the store's, never overload (RESOURCE_EXHAUSTED is for a node that cannot keep up)."""

import asyncio
import os
import signal
from collections import Counter

import grpc

from proto import serverless_sim_pb2 as pb
from runtime.natsd import NatsServer
from tests.stack import Stack


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
