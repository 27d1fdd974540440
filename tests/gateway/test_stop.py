"""A gateway's stop: a call still waiting when its grace runs out is refused UNAVAILABLE, which its caller sends again
(to the node that takes over, or to this one started again), and an Assign so refused is given up: the node holds
no request for a caller that left."""

import asyncio
import time

import grpc

from scaler.runtime.natsd import NatsServer
from tests.stack import Stack, eventually

GRACE_S = 5  # Gateway.stop's: what the calls under way are given to finish


async def test_an_assign_still_waiting_at_a_stop_is_refused_unavailable_and_given_up(tmp_path):
    # Every CreateSlot takes a minute: a cold Assign waits through the whole stop.
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url, create_latency_ms=60_000) as stack:
        call = asyncio.create_task(stack.assign("r1"))
        await eventually(lambda: any(s.queue for s in stack.controller.states.values()))
        said = await stack.controller.drain()  # as a node's stop begins (scaler/cli/node.py): nobody to take over
        assert "no other node" in said
        began = time.monotonic()
        await stack.gateway.stop()
        assert time.monotonic() - began >= GRACE_S - 0.5  # it was given the grace to be answered in
        try:
            await call
        except grpc.aio.AioRpcError as e:
            assert e.code() is grpc.StatusCode.UNAVAILABLE, e  # not CANCELLED: a call its caller may send again
        else:
            raise AssertionError(f"answered with no instance ready: {call.result()}")
        await eventually(lambda: not any(s.queue for s in stack.controller.states.values()))
        assert all(i.request_id != "r1" for s in stack.controller.states.values() for i in s.instances.values())
