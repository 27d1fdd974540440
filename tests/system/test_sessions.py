"""Sessions on real processes: a real nats-server, the node's gRPC service, the platform stub."""

import asyncio

import grpc
import pytest

from scaler.proto import events as e
from scaler.proto.subjects import function_events
from scaler.runtime.bus import connected
from scaler.store import stream
from tests.replay.test_replay import scaler_replay
from tests.stack import Stack


async def stored_events(nats_url: str, key: str = "fn") -> list[list[e.Event]]:
    """The function's batches as stored, each as its list of events."""
    batches = []
    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), lambda seq, b: batches.append(b.events), function_events(key), 0)
    return batches


async def two_idle(stack: Stack) -> None:
    a, b = await asyncio.gather(stack.assign("a"), stack.assign("b"))
    await asyncio.gather(stack.idle(a), stack.idle(b))


async def test_a_session_keeps_its_instance_and_moves_when_it_stays_busy(nats_url):
    async with Stack(nats_url) as stack:
        await two_idle(stack)
        s1 = await stack.assign("s1", session="chat")
        first = s1.assigment.instance_id
        await stack.idle(s1)  # the session's instance idled last: the policy's pick for anyone now
        other = await stack.assign("n1")  # no session: it leaves the session's instance alone
        assert other.assigment.instance_id != first
        again = await stack.assign("s2", session="chat")
        assert again.assigment.instance_id == first
        await stack.idle(other)
        # s2 still holds the session's instance: s3 waits for it a while, then takes the idle other one
        moved = await stack.assign("s3", session="chat")
        assert moved.assigment.instance_id == other.assigment.instance_id
        await asyncio.gather(stack.idle(again), stack.idle(moved))
        assert stack.controller.states["fn"].sessions["chat"].instance_id == moved.assigment.instance_id

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.assign("big", session="x" * 257)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "scaler-session" in refused.value.details()

    batches = await stored_events(nats_url)
    arrived = next(n for n, b in enumerate(batches) if any(getattr(x, "request_id", "") == "s3" for x in b))
    served = next(
        n for n, b in enumerate(batches) if any(isinstance(x, e.Assigned) and x.request_id == "s3" for x in b)
    )
    assert served > arrived  # it waited for its busy instance rather than take the idle one at once
    bound = [x for b in batches for x in b if isinstance(x, e.SessionBound)]
    assert [(x.request_id, x.instance_id) for x in bound] == [
        ("s1", first),
        ("s3", other.assigment.instance_id),
    ]
    code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn")
    assert code == 0, err
    assert f"session chat bound to {first} by s1" in out
    assert f"session chat → {other.assigment.instance_id}" in out
