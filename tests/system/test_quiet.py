"""Normal operation logs nothing alarming; a lasting fault is one line, then rarely (issue 12, item 6).

Through `scaler up` as a user runs it, against a platform in this process that the test controls.
"""

import asyncio
import logging
import time

import grpc

from scaler.platform_stub.server import PlatformStub
from scaler.proto import platform_admin_pb2 as admin
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.faults import LastingFault
from scaler.runtime.ports import free_port
from scaler.simulator.dataset import FunctionMeta
from scaler.workers import effects
from scaler.workers import platform as platform_worker
from tests.cli.test_up import Log, start_up
from tests.stack import Stack, eventually


class Platform(PlatformStub):
    """The stub, counting the lists it was asked for, and refusing DestroySlot while `refuse` is set."""

    listed = 0
    refuse = False

    async def ListSlots(self, request: admin.ListSlotsRequest, context) -> admin.ListSlotsReply:
        self.listed += 1
        return await super().ListSlots(request, context)

    async def DestroySlot(self, request: pb.DestroySlotRequest, context) -> pb.DestroySlotReply:
        if self.refuse:
            return pb.DestroySlotReply(status=pb.InternalError, error_message="the platform is gone")
        return await super().DestroySlot(request, context)


async def call(address: str, key: str, need_destroy: bool = False) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)
        meta = pb.Meta(key=key, runtime="python", memory_in_mb=128)
        reply = await scaler.Assign(pb.AssignRequest(request_id=f"{key}-r", meta_data=meta), timeout=60)
        result = pb.Result(status_code=500 if need_destroy else 200, need_destroy=need_destroy)
        await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=result), timeout=20)


async def stopped(proc: asyncio.subprocess.Process, log: Log) -> tuple[int, str, float]:
    """SIGINT (Ctrl-C); the exit status, everything it logged, and how long it took to stop."""
    began = time.monotonic()
    proc.send_signal(2)
    async with asyncio.timeout(30):
        err = await log.close()
        code = await proc.wait()
    return code, err, time.monotonic() - began


async def test_the_documented_start_order_reconciles_once_the_platform_is_there_and_says_nothing():
    at = f"127.0.0.1:{free_port()}"
    proc, address, lines = await start_up("--platform", at)  # the scaler first: nobody serves `at` yet
    log = Log(proc, lines)
    await asyncio.sleep(2)  # the gc worker has started, and found no platform
    platform = Platform(at)
    await platform.start()
    try:
        await eventually(lambda: platform.listed == 1, seconds=20)
        await call(address, "fn")
    finally:
        code, err, _ = await stopped(proc, log)
        await platform.stop()
    assert code == 0, err
    assert "WARNING" not in err and "ERROR" not in err, err


async def test_a_platform_refusing_every_destroy_is_one_line_not_one_per_retry():
    platform = Platform("127.0.0.1:0")
    await platform.start()
    proc, address, lines = await start_up("--platform", f"127.0.0.1:{platform.port}")
    log = Log(proc, lines)
    try:
        platform.refuse = True
        await asyncio.gather(call(address, "a", need_destroy=True), call(address, "b", need_destroy=True))
        await log.wait_for("the platform is gone")
        await asyncio.sleep(12)  # each batch was tried again (after 5 s, then 10 s)
        assert log.count("DestroySlot") == 1, log.lines
        platform.refuse = False
        await log.wait_for("gc worker: working again after ", seconds=30)
        await eventually(lambda: not platform.accounting.live, seconds=30)
    finally:
        code, err, _ = await stopped(proc, log)
        await platform.stop()
    assert code == 0, err
    assert err.count("ERROR") == 1, err


async def test_ctrl_c_while_the_platform_is_at_work_is_prompt_and_quiet():
    # An Init that never ends: a part waiting for it would wait out stopped()'s 30 s, one killed at its stop
    # timeout is a WARNING.
    slow = FunctionMeta(key="slow", runtime="python", memory_in_mb=128, init_duration_in_ms=3_600_000)
    platform = Platform("127.0.0.1:0", {"slow": slow})
    await platform.start()
    proc, address, lines = await start_up("--platform", f"127.0.0.1:{platform.port}")
    log = Log(proc, lines)
    waiting = asyncio.create_task(call(address, "slow"))
    try:
        await eventually(lambda: platform.accounting.live, seconds=20)  # CreateSlot done, Init under way
        await asyncio.sleep(0.5)
        code, err, _ = await stopped(proc, log)
        initialising = [s for s in platform.accounting.slots.values() if not s.ready_ms]
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await platform.stop()
    assert code == 0, err
    assert "ERROR" not in err and "WARNING" not in err and "Traceback" not in err, err
    assert len(initialising) == 1, "stopped while the Init was still under way"


async def test_a_platform_gone_is_one_line_for_both_workers_saying_what_to_do(nats_url, caplog, monkeypatch):
    """A simulator's platform goes when its run ends, and the scaler left running still has calls for it: the
    platform worker's CreateSlot, the gc worker's DestroySlot, each batch redelivered. One line says so."""
    monkeypatch.setattr(effects, "RETRY_S", 0.2)  # a failed batch comes back soon, for more failures
    caplog.set_level(logging.WARNING, logger="scaler.effects")
    async with Stack(nats_url) as stack:
        for worker in (stack.platform_worker, stack.gc_worker):
            worker.patience_s = 0.3
        first = await stack.assign("r1", key="a")
        platform = f"127.0.0.1:{stack.stub.port}"
        await stack.stub.stop()
        await stack.idle(first, need_destroy=True)  # DestroySlot, for the gc worker
        creating = asyncio.create_task(stack.assign("r2", key="b"))  # CreateSlot, for the platform worker
        try:
            await eventually(lambda: effects.away(platform).count >= 6, 30)
        finally:
            creating.cancel()
            await asyncio.gather(creating, return_exceptions=True)
    said = [r.getMessage() for r in caplog.records if r.name == "scaler.effects"]
    assert len(said) == 1, "\n".join(said)
    assert said[0].startswith(f"the platform at {platform} does not answer (Connection refused): "), said
    assert "A simulator's platform goes when its run ends: then stop this scaler" in said[0]


def test_a_lasting_fault_is_summed_up_ever_more_rarely(caplog):
    now = [0.0]
    fault = LastingFault(logging.getLogger("test.fault"), "gc worker", clock=lambda: now[0])
    for second in range(0, 3600, 5):  # an hour of failures, one every 5 s
        now[0] = second
        fault.occurred(f"failure at {second}")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "failure at 0"
    assert lines[1].startswith("gc worker: 12 more failures in the last 60s, still failing; the latest: failure at 60")
    assert len(lines) == 1 + 5  # then after 2, 4, 8, 16 more minutes: 60 s, 180, 420, 900, 1860
    now[0] = 3600
    fault.ended()
    assert caplog.records[-1].getMessage() == "gc worker: working again after 720 failures over 60 min"


async def test_reports_nobody_stores_are_one_line_per_outage_not_a_traceback_per_batch(nats_url, caplog, monkeypatch):
    """No controller serves a function's partition (all nodes down, or a take-over that takes long): the platform
    worker's report of a slot finds nobody, batch after batch. That is an expected condition: one line, no
    traceback, and a line when reports are stored again."""
    monkeypatch.setattr(effects, "REPORT_PATIENCE_S", 0.3)
    monkeypatch.setattr(platform_worker, "REPORT_PATIENCE_S", 0.3)
    monkeypatch.setattr(effects, "RETRY_S", 0.1)
    caplog.set_level(logging.WARNING)
    async with Stack(nats_url, create_latency_ms=1500) as stack:
        assigning = asyncio.create_task(stack.assign("r1"))
        await eventually(lambda: stack.stub.accounting.live)  # CreateSlot under way: its report comes next
        await stack.controller.stop()
        stack.parts.remove(stack.controller)
        tries = lambda: sum("no answer on report." in r.getMessage() for r in caplog.records)  # noqa: E731
        await eventually(lambda: tries() >= 4, seconds=30)  # the batch failed and came back three times
        assigning.cancel()
        await asyncio.gather(assigning, return_exceptions=True)
    worker = [r for r in caplog.records if r.name.startswith(("scaler.effects", "scaler.platform_worker"))]
    assert [r.getMessage() for r in worker if r.exc_info] == []
    assert len([r for r in worker if r.levelno >= logging.ERROR]) == 1, [r.getMessage() for r in worker]
    assert "nobody stored its report" in worker[0].getMessage(), worker[0].getMessage()
