"""Live mode: replay a dataset against a running gateway, as the challenge's simulator did.

We serve the Platform API ourselves (the platform stub, in this process), call Assign at each
request's start time, hold the instance for its duration, then call Idle (need_destroy when the
trace's status is not 200). With speed N the timeline, the platform's latencies and the holds
all run N times faster; the scaler must run at the same speed (`scaler up --speed N`).

How schedule time is counted, so that it is comparable across speeds: of an Assign's wait, the
parts the simulator controls (CreateSlot, Init, and executions on the instance it got) count in
trace time, and the rest (the scaler's own work) counts at its real, unscaled duration. At
speed 1 this is simply the measured time. Idle time is the Idle call's real duration.
"""

import asyncio
import secrets
import sys
from collections import defaultdict
from dataclasses import dataclass

import grpc

from platform_stub.server import PlatformStub, SlotRecord
from proto import serverless_sim_pb2 as pb
from proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.clock import Clock
from simulator.dataset import Dataset, Request
from simulator.score import Invocation, Run


@dataclass
class Call:
    """One request as the driver saw it, in clock ms."""

    request: Request
    assign_start: int = 0
    assign_end: int = 0
    idle_start: int = 0
    idle_end: int = 0
    instance_id: str = ""
    error: str = ""


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done = self.failed = self.in_flight = 0

    def show(self, final: bool = False) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        line += f"  in flight {self.in_flight}  failed {self.failed}"
        sys.stderr.write(line + ("\n" if final else ""))
        sys.stderr.flush()

    async def run(self) -> None:
        while True:
            self.show()
            await asyncio.sleep(0.5)


class LiveRun:
    def __init__(
        self, dataset: Dataset, scaler: pb_grpc.ScalerStub, stub: PlatformStub, clock: Clock, progress: bool = False
    ) -> None:
        self.dataset = dataset
        self.scaler = scaler
        self.stub = stub
        self.clock = clock
        self.calls = [Call(r) for r in dataset.requests]
        self.progress = Progress(len(self.calls), progress)
        self._tag = secrets.token_hex(4)  # request ids never repeat across runs against one scaler

    async def run(self) -> Run:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        ticker = asyncio.create_task(self.progress.run())
        tasks = []
        for n, call in enumerate(self.calls):
            at = begin + self.clock.real_s(call.request.start_time - self.dataset.start_ms)
            if (delay := at - loop.time()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._invoke(n, call)))
        await asyncio.gather(*tasks)
        ticker.cancel()
        self.progress.show(final=True)
        return self.result(self.clock.now_ms())

    async def _invoke(self, n: int, call: Call) -> None:
        r = call.request
        meta = self.dataset.metas[r.meta_key]
        pb_meta = pb.Meta(
            key=r.meta_key, runtime=meta.runtime, timeout_in_secs=meta.timeout_in_secs, memory_in_mb=meta.memory_in_mb
        )
        self.progress.in_flight += 1
        try:
            call.assign_start = self.clock.now_ms()
            request = pb.AssignRequest(request_id=f"{self._tag}-{n}", timestamp=r.start_time, meta_data=pb_meta)
            reply = await self.scaler.Assign(request)
            call.assign_end = self.clock.now_ms()
            call.instance_id = reply.assigment.instance_id
            await self.clock.sleep_ms(r.durations_in_ms)
            result = pb.Result(
                status_code=r.status_code, duration_in_ms=r.durations_in_ms, need_destroy=r.status_code != 200
            )
            call.idle_start = self.clock.now_ms()
            await self.scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=result))
            call.idle_end = self.clock.now_ms()
        except grpc.aio.AioRpcError as e:
            call.error = f"{e.code().name}: {e.details()}"
            call.assign_end = call.assign_end or self.clock.now_ms()
            self.progress.failed += 1
        finally:
            self.progress.in_flight -= 1
            self.progress.done += 1

    def result(self, end_ms: int) -> Run:
        slots = {s.instance_id: s for s in self.stub.accounting.slots.values() if s.instance_id}
        executions: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for c in self.calls:
            if c.instance_id and c.idle_start:
                executions[c.instance_id].append((c.assign_end, c.idle_start))
        invocations = [self._invocation(c, slots.get(c.instance_id), executions[c.instance_id]) for c in self.calls]
        a = self.stub.accounting
        return Run(invocations, a.gb_s(end_ms), a.created, a.gb_s_by_key(end_ms))

    def _invocation(self, c: Call, slot: SlotRecord | None, executions: list[tuple[int, int]]) -> Invocation:
        meta = self.dataset.metas[c.request.meta_key]
        controlled = list(executions)
        if slot is not None:
            controlled += [(slot.created_ms, slot.created_done_ms), (slot.init_started_ms, slot.ready_ms)]
        window = c.assign_end - c.assign_start
        overlap = _overlap(c.assign_start, c.assign_end, controlled)
        schedule = overlap + (window - overlap) / self.clock.speed
        return Invocation(
            key=c.request.meta_key,
            memory_mb=meta.memory_in_mb,
            execution_ms=c.request.durations_in_ms,
            schedule_ms=schedule,
            idle_ms=(c.idle_end - c.idle_start) / self.clock.speed,
            cold=slot is not None and slot.ready_ms > c.assign_start,
            failed=bool(c.error),
        )


def _overlap(start: int, end: int, intervals: list[tuple[int, int]]) -> int:
    """Length of [start, end] covered by the union of `intervals`."""
    covered = 0
    reach = start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


async def run_live(
    dataset: Dataset,
    gateway: str,
    speed: float = 1.0,
    platform_listen: str = "0.0.0.0:50051",
    create_latency_ms: int = 100,
    progress: bool = False,
) -> Run:
    """Serve the Platform API on `platform_listen` and drive the scaler at `gateway`."""
    clock = Clock(speed)
    stub = PlatformStub(platform_listen, dataset.metas, create_latency_ms, clock)
    await stub.start()
    try:
        async with grpc.aio.insecure_channel(gateway) as channel:
            return await LiveRun(dataset, pb_grpc.ScalerStub(channel), stub, clock, progress).run()
    finally:
        await stub.stop()


__all__ = ["LiveRun", "run_live"]
