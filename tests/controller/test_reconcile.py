"""Reconcile on start, end to end: the platform's live slots and the state agree afterwards, and the log says why."""

import asyncio
import io
import logging

import grpc
import pytest

from scaler import replay
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.events import InstanceDestroyed, InstanceRetired
from scaler.runtime.bus import connected
from scaler.workers.gc import GcWorker
from tests.stack import Stack, eventually


async def stray_slot(stub: PlatformStub, request_id: str, instance_id: str = "", key: str = "fn") -> str:
    """A slot made behind the scaler's back, as a crashed worker or an operator might leave one."""
    config = pb.ResourceConfig(memory_in_megabytes=128)
    created = await stub.CreateSlot(pb.CreateSlotRequest(request_id=request_id, resource_config=config), None)
    if instance_id:
        meta = pb.Meta(key=key, memory_in_mb=128)
        request = pb.InitRequest(
            request_id=request_id, slot_id=created.slot.id, instance_id=instance_id, meta_data=meta
        )
        await stub.Init(request, None)
    return created.slot.id


async def test_reconcile_on_start_destroys_strays_and_drops_what_is_gone(nats_url):
    async with Stack(nats_url) as stack:
        held = await stack.assign("r1")  # fn-1, busy: its slot will vanish
        freed = await stack.assign("r2")  # fn-2, idle: stays
        await stack.idle(freed)
        slots = stack.live_instances()
        await stack.stub.DestroySlot(pb.DestroySlotRequest(id=slots["fn-1"]), None)
        x1 = await stray_slot(stack.stub, "x1", "fn-9")  # of this function, an instance it never had
        x2 = await stray_slot(stack.stub, "x2")  # CreateSlot done, never initialised
        x3 = await stray_slot(stack.stub, "x3", "ghost-1", key="ghost")  # of a function the scaler never saw
        strays = {x1, x2, x3}
        assert strays <= set(stack.stub.accounting.live)

        # A gc worker (re)starts: it lists the platform's slots and the controller reconciles.
        await stack.gc_worker.stop()
        platform = f"127.0.0.1:{stack.stub.port}"
        stack.gc_worker = stack.parts[3] = GcWorker(nats_url, platform, stack.clock, reconcile_grace_s=0)
        await stack.gc_worker.start()
        assert await stack.gc_worker.reconciled == 4  # in the background, once the platform answered
        await eventually(lambda: set(stack.stub.accounting.live) == {slots["fn-2"]})
        await stack.settled()
        assert stack.live_instances() == {"fn-2": slots["fn-2"]}

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stack.idle(held)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert (await stack.assign("r3")).assigment.instance_id == "fn-2"

        async with connected(nats_url, "test") as nc:
            reasons = []
            await replay.replay(nc, seen=lambda seq, b: reasons.extend(why(ev) for ev in b.events))
            assert "fn-1: slot gone: the platform no longer lists " + slots["fn-1"] in reasons
            unknown = {f"fn-9@{x1}", f"slot@{x2}", f"ghost-1@{x3}"}
            assert {f"{i}: unknown to the state" for i in unknown} <= set(reasons)
            assert await replay.verify(nc, None, io.StringIO()) == 0


def why(ev) -> str:
    return f"{ev.instance_id}: {ev.reason}" if isinstance(ev, InstanceRetired | InstanceDestroyed) else ""


async def test_a_slot_being_created_is_not_taken_for_a_stray(nats_url):
    async with Stack(nats_url, create_latency_ms=1500) as stack:
        pending = asyncio.create_task(stack.assign("r1"))
        await eventually(lambda: stack.stub.accounting.live)  # CreateSlot under way, unknown to the state
        assert stack.live_instances() == {"fn-1": ""}
        await stack.gc_worker.reconcile()  # the default grace period
        reply = await pending
        assert reply.assigment.instance_id == "fn-1"
        await stack.settled()
        assert set(stack.stub.accounting.live) == set(stack.live_instances().values())


async def test_a_platform_that_cannot_list_slots_is_left_alone(nats_url, caplog):
    server = grpc.aio.server()
    pb_grpc.add_PlatformServicer_to_server(PlatformStub(), server)  # the challenge's service only
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        gc = GcWorker(nats_url, f"127.0.0.1:{port}")
        with caplog.at_level(logging.INFO, logger="scaler.gc_worker"):
            await gc.start()
            reconciled = await gc.reconciled
        try:
            assert reconciled is None
            assert "the platform cannot list its slots: no reconcile" in caplog.text
        finally:
            await gc.stop()
    finally:
        await server.stop(0)


async def test_a_platform_gone_away_is_one_line_in_the_log(nats_url, caplog):
    async with Stack(nats_url) as stack:
        reply = await stack.assign("r1")
        await stack.stub.stop()  # the platform goes away while its slot is still to be destroyed
        stack.gc_worker.patience_s = 0.5
        with caplog.at_level(logging.ERROR, logger="scaler.effects"):
            await stack.idle(reply, need_destroy=True)
            await eventually(lambda: "does not answer" in caplog.text, seconds=10)
            await asyncio.sleep(1.5)  # redeliveries come meanwhile; none is said again
        (failure,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
        said = failure.getMessage()
        assert said.startswith(f"the platform at 127.0.0.1:{stack.stub.port} does not answer"), said
        assert failure.exc_info is None  # an expected failure: no traceback


async def test_loads_a_platform_cannot_be_reconciled_for_are_counted(nats_url):
    """A node asks for a reconcile after each load of partitions; a platform that cannot list its slots is said in
    the node's metric, so what it may hold unchecked is seen."""
    async with Stack(nats_url, like_challenge=True) as stack:
        await eventually(lambda: stack.controller.unreconciled >= 1, 15)
