"""Live mode: replay a dataset against a running gateway, as the challenge's simulator did.

We serve the Platform API ourselves (the platform stub, in this process), call Assign at each
request's start time, hold the instance for its duration, then call Idle (need_destroy when the
trace's status is not 200). With speed N the timeline, the platform's latencies and the holds
all run N times faster; the scaler must run at the same speed (`scaler up --speed N`).

How schedule time is counted, so that it is comparable across speeds: of an Assign's wait, the
parts the simulator controls count at their nominal length in trace time (CreateSlot and Init
of the instance it got, and executions of earlier requests on that instance), and the rest (the
scaler's own work, and any lag of this process) counts at its real, unscaled duration. At speed
1 this is simply the measured time. Idle time is the Idle call's real duration.

Each answer is checked as the challenge's platform did: the instance must run on one of this
platform's live slots, be initialised, and run no other request (`Holds`, our own bookkeeping
of who runs where); a request whose slot is destroyed before its execution ends fails too. A
request that failed at its Assign is not executed, and what it was given is handed back with
an Idle at once. After the last Idle the platform runs on for RUN_TAIL_MS (the end of the run).
"""

import asyncio
import contextlib
import itertools
import secrets
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
import msgspec

from scaler.platform_stub.server import DEFAULT_INIT_MS, PlatformStub, SlotRecord
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.info import Info, NoAnswer, ask
from scaler.runtime import tls
from scaler.runtime.clock import Clock
from scaler.runtime.http import HttpEndpoint
from scaler.runtime.ports import CannotListen
from scaler.simulator.dataset import Dataset, Request
from scaler.simulator.holds import Holds
from scaler.simulator.latency import CallTimes, Latency, SlotTimes, measure, read_batches
from scaler.simulator.progress import Progress
from scaler.simulator.score import RUN_TAIL_MS, Failure, Invocation, Run

GATEWAY_WAIT_S = 5.0  # how long a gateway may take to accept the connection before we give up
# As a platform does: a call the scaler refused as unavailable or overloaded (a node restarting, a node
# away) is sent again, the same request, for up to RETRY_FOR_S of real time, waiting ever longer between.
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
RETRY_FOR_S = 60.0
RETRY_WAIT_S = (0.05, 1.0)  # the first wait, and the longest
# Reconnect within a second of a node coming back, not after gRPC's backoff of up to two minutes.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


T = TypeVar("T")


class LiveError(Exception):
    """The live run could not be done, or its figures would be meaningless; the message says why."""


@dataclass(slots=True)
class Call:
    """One request as the driver saw it, in clock ms."""

    request: Request
    assign_start: int = 0
    assign_end: int = 0
    idle_start: int = 0
    idle_end: int = 0
    instance_id: str = ""
    failure: Failure | None = None
    error: str = ""  # the first call error's message
    done: bool = False


class LiveRun:
    def __init__(
        self,
        dataset: Dataset,
        scaler: pb_grpc.ScalerStub,
        stub: PlatformStub,
        clock: Clock,
        progress: Progress | None = None,
        tail_ms: int = RUN_TAIL_MS,
    ) -> None:
        self.dataset = dataset
        self.scaler = scaler
        self.stub = stub
        self.clock = clock
        self.tail_ms = tail_ms
        self.holds = Holds()
        self._by_instance: dict[str, SlotRecord] = {}  # slots indexed by the instance Init put on them
        self._indexed = 0  # slots of the platform's accounting looked at so far
        self._unnamed: list[SlotRecord] = []  # those no Init had reached then
        self.calls = [Call(r) for r in dataset.requests]
        self.retried: Counter[str] = Counter()  # "Assign: UNAVAILABLE" -> calls sent again
        self.progress = progress
        self.done = self.failed = self.in_flight = 0  # requests
        self.begin_ms = clock.now_ms()
        self._tail_began: int | None = None  # when the last request was done: the run's end follows
        self._refused: asyncio.Future[str] | None = None  # why the run cannot go on, said at the first sign
        self._pending: set[asyncio.Task] = set()  # calls under way
        self._ours = False  # an instance the scaler handed out ran on this platform
        self._tag = secrets.token_hex(4)  # request ids never repeat across runs against one scaler
        self._metas = {
            key: pb.Meta(key=key, runtime=m.runtime, timeout_in_secs=m.timeout_in_secs, memory_in_mb=m.memory_in_mb)
            for key, m in dataset.metas.items()
        }

    async def run(self) -> Run:
        """Replay the trace; raise LiveError as soon as an answer shows the run cannot mean anything."""
        self._refused = asyncio.get_running_loop().create_future()
        replay = asyncio.create_task(self._replay())
        await asyncio.wait([replay, self._refused], return_when=asyncio.FIRST_COMPLETED)
        if not replay.done():
            replay.cancel()
            for task in list(self._pending):
                task.cancel()
            await asyncio.gather(replay, *self._pending, return_exceptions=True)
            raise LiveError(self._refused.result())
        return replay.result()

    async def _replay(self) -> Run:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        self.begin_ms = self.clock.now_ms()
        ticker = asyncio.create_task(self._tick()) if self.progress is not None else None
        # Only calls under way are held: a 436k-request trace would otherwise keep every task.
        pending = self._pending
        crashed: list[BaseException] = []

        def finished(task: asyncio.Task) -> None:
            pending.discard(task)
            if not task.cancelled() and task.exception() is not None:
                crashed.append(task.exception())

        try:
            for n, call in enumerate(self.calls):
                at = begin + self.clock.real_s(call.request.start_time - self.dataset.start_ms)
                if (delay := at - loop.time()) > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._invoke(n, call))
                pending.add(task)
                task.add_done_callback(finished)
            if pending:
                await asyncio.wait(pending)
            if not crashed:
                self._tail_began = self.clock.now_ms()
                await self.clock.sleep_ms(self.tail_ms)
        finally:
            if ticker is not None:
                ticker.cancel()
        if crashed:
            raise crashed[0]
        self.show_progress(final=True)
        return self.result(self.clock.now_ms())

    async def _tick(self) -> None:
        while True:
            self.show_progress()
            await asyncio.sleep(0.25)

    def show_progress(self, final: bool = False) -> None:
        if self.progress is not None:
            now = self.clock.now_ms()
            tail = None if self._tail_began is None else (min(now - self._tail_began, self.tail_ms), self.tail_ms)
            self.progress.show(self.done, now - self.begin_ms, self.failed, self.in_flight, final=final, tail=tail)

    def _refuse(self, why: str) -> None:
        if self._refused is not None and not self._refused.done():
            self._refused.set_result(why)

    async def _invoke(self, n: int, call: Call) -> None:
        """One request, counted done once it completed: one cut short (Ctrl-C) is in no statistics."""
        self.in_flight += 1
        try:
            await self._request(n, call)
        finally:
            self.in_flight -= 1
        call.done = True
        self.done += 1
        self.failed += call.failure is not None

    async def _request(self, n: int, call: Call) -> None:
        r = call.request
        request_id = f"{self._tag}-{n}"
        call.assign_start = self.clock.now_ms()
        request = pb.AssignRequest(request_id=request_id, timestamp=r.start_time, meta_data=self._metas[r.meta_key])
        try:
            reply = await self._sent("Assign", lambda: self.scaler.Assign(request))
        except grpc.aio.AioRpcError as e:
            call.assign_end = self.clock.now_ms()
            self._failed(call, Failure.ASSIGN_ERROR, f"{e.code().name}: {e.details()}")
            return
        call.assign_end = self.clock.now_ms()
        if reply.status != pb.Ok:
            self._failed(call, Failure.ASSIGN_ERROR, f"{pb.Status.Name(reply.status)}: {reply.error_message}")
            return
        call.instance_id = reply.assigment.instance_id
        slot = self._slot_of(call.instance_id)
        if slot is not None:
            self._ours = True
        elif not self._ours:  # said at once, not after hours of a run that cannot count
            self._refuse(self._not_ours(call.instance_id))
        live = slot is not None and slot.destroyed_ms is None
        call.failure = self.holds.assign(call.instance_id, request_id, live=live, ready=live and slot.ready_ms > 0)
        if call.failure is None:
            await self.clock.sleep_ms(r.durations_in_ms)
            call.failure = self.holds.finish(call.instance_id, request_id, live=slot.destroyed_ms is None)
        result = pb.Result(
            status_code=r.status_code, duration_in_ms=r.durations_in_ms, need_destroy=r.status_code != 200
        )
        call.idle_start = self.clock.now_ms()
        try:
            idle_request = pb.IdleRequest(assigment=reply.assigment, result=result)
            idle = await self._sent("Idle", lambda: self.scaler.Idle(idle_request))
            if idle.status != pb.Ok:
                self._failed(call, Failure.IDLE_ERROR, f"{pb.Status.Name(idle.status)}: {idle.error_message}")
        except grpc.aio.AioRpcError as e:
            self._failed(call, Failure.IDLE_ERROR, f"{e.code().name}: {e.details()}")
        call.idle_end = self.clock.now_ms()

    async def _sent(self, method: str, send: Callable[[], Awaitable[T]]) -> T:
        """`send()`, again while the scaler refuses it as unavailable (RETRIED), for up to RETRY_FOR_S."""
        loop = asyncio.get_running_loop()
        until = wait = None
        while True:
            try:
                return await send()
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRIED:
                    raise
                until = until or loop.time() + RETRY_FOR_S
                wait = min(wait * 2, RETRY_WAIT_S[1]) if wait else RETRY_WAIT_S[0]
                if loop.time() + wait > until:
                    raise
                self.retried[f"{method}: {e.code().name}"] += 1
            await asyncio.sleep(wait)

    @staticmethod
    def _failed(call: Call, failure: Failure, error: str) -> None:
        call.failure = call.failure or failure
        call.error = call.error or error

    def _slot_of(self, instance_id: str) -> SlotRecord | None:
        """The slot Init put `instance_id` on; slots are indexed as they get one (a trace makes thousands)."""
        if instance_id not in self._by_instance:
            slots = self.stub.accounting.slots
            if new := len(slots) - self._indexed:
                self._unnamed += itertools.islice(reversed(slots.values()), new)
                self._indexed = len(slots)
            for slot in self._unnamed:
                if slot.instance_id:
                    self._by_instance.setdefault(slot.instance_id, slot)
            self._unnamed = [slot for slot in self._unnamed if not slot.instance_id]
        return self._by_instance.get(instance_id)

    def slots_by_instance(self) -> dict[str, SlotRecord]:
        return {s.instance_id: s for s in self.stub.accounting.slots.values() if s.instance_id}

    def call_times(self) -> list[CallTimes]:
        """Each request's calls as this platform made them (for a latency model: scaler/simulator/latency.py)."""
        return [
            CallTimes(f"{self._tag}-{n}", c.assign_start, c.assign_end, c.idle_start, c.idle_end, c.instance_id)
            for n, c in enumerate(self.calls)
            if c.done and c.failure is None
        ]

    def slot_times(self) -> list[SlotTimes]:
        """Each slot as this platform ran it, with its CreateSlot and Init's nominal lengths."""
        metas = self.dataset.metas
        return [
            SlotTimes(
                s.instance_id,
                s.created_ms,
                s.ready_ms,
                s.destroyed_ms,
                self.stub.create_latency_ms + (metas[s.key].init_duration_in_ms if s.key in metas else DEFAULT_INIT_MS),
            )
            for s in self.stub.accounting.slots.values()
            if s.instance_id
        ]

    def _not_ours(self, instance_id: str) -> str:
        return (
            f"the scaler's first answer is {instance_id}, an instance this simulator's platform never started: the"
            " scaler uses another platform, or remembers an earlier platform's instances. "
            + fresh_scaler(self.stub.port, self.clock.speed)
        )

    def so_far(self) -> dict:
        """The statistics of the requests done so far (slots charged until now), and how far the run is."""
        now = self.clock.now_ms()
        stats = self.result(now, [c for c in self.calls if c.done]).stats() if self.done else None
        return {
            "requestsDone": self.done,
            "requestsTotal": len(self.calls),
            "inFlight": self.in_flight,
            "traceSecs": (now - self.begin_ms) / 1000,
            "statistics": msgspec.to_builtins(stats) if stats is not None else None,
        }

    def partial(self) -> Run:
        """The run of the requests done so far, slots charged until now (a run cut short)."""
        return self.result(self.clock.now_ms(), [c for c in self.calls if c.done])

    def stats_page(self) -> tuple[str, bytes]:
        return "application/json", msgspec.json.encode(self.so_far()) + b"\n"

    def errors(self) -> Counter[str]:
        return Counter(c.error for c in self.calls if c.error)

    def result(self, end_ms: int, calls: list[Call] | None = None) -> Run:
        """The run of `calls` (all of them by default), slots charged until `end_ms`."""
        slots = self.slots_by_instance()
        # Executions on each instance, at their nominal length; one at a time, so in start order
        # their ends ascend too.
        executions: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for c in self.calls:
            if c.instance_id:
                executions[c.instance_id].append((c.assign_end, c.assign_end + c.request.durations_in_ms))
        starts: dict[str, list[int]] = {}
        for instance, runs in executions.items():
            runs.sort()
            starts[instance] = [a for a, _ in runs]
        invocations = []
        for c in self.calls if calls is None else calls:
            slot = slots.get(c.instance_id)
            controlled = self._platform_work(slot)
            if c.instance_id:
                controlled += _ending_after(
                    starts[c.instance_id], executions[c.instance_id], c.assign_start, c.assign_end
                )
            invocations.append(self._invocation(c, slot, controlled))
        a = self.stub.accounting
        return Run(invocations, a.gb_s(end_ms), a.created, a.gb_s_by_key(end_ms))

    def _platform_work(self, slot: SlotRecord | None) -> list[tuple[int, int]]:
        """CreateSlot and Init of a slot, at the lengths the stub was asked to take."""
        if slot is None:
            return []
        done = slot.init_done
        if done is not None and done.done() and not done.cancelled() and done.exception() is None:
            init_ms = done.result().init_duration_in_ms
        else:
            init_ms = slot.ready_ms - slot.init_started_ms
        return [
            (slot.created_ms, slot.created_ms + self.stub.create_latency_ms),
            (slot.init_started_ms, slot.init_started_ms + init_ms),
        ]

    def _invocation(self, c: Call, slot: SlotRecord | None, controlled: list[tuple[int, int]]) -> Invocation:
        meta = self.dataset.metas[c.request.meta_key]
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
            failure=c.failure,
        )


def fresh_scaler(platform_port: int, speed: float) -> str:
    """What to do when the scaler cannot serve this run."""
    return (
        "Each run needs a scaler using this platform, with an empty store: stop that one and start a fresh"
        f" `scaler up --platform HOST:{platform_port} --speed {speed:g}` (HOST being this machine; no --data-dir, or"
        " an empty one), or run compose's sim profile with `--env-file sim.env` (NATS's store on a tmpfs)"
    )


def _ending_after(starts: list[int], runs: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The runs (sorted, ends ascending) that overlap [start, end]."""
    hi = bisect_left(starts, end)
    lo = hi
    while lo > 0 and runs[lo - 1][1] > start:
        lo -= 1
    return runs[lo:hi]


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


async def _platform_quiet(stub: PlatformStub, dataset: Dataset) -> None:
    """Let CreateSlot and Init calls still under way finish before the platform goes, so that the
    scaler sees them answered rather than cut off. They no longer count: the run is accounted."""
    longest_ms = stub.create_latency_ms + max(m.init_duration_in_ms for m in dataset.metas.values())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(stub.clock.real_s(longest_ms) + 1):
            while True:
                if all(s.ready_ms for s in stub.accounting.live.values()):
                    return
                await asyncio.sleep(0.05)


@dataclass
class LiveOutcome:
    run: Run
    errors: Counter[str]  # how the failed calls failed: message -> count
    retried: Counter[str]  # calls sent again: "Assign: UNAVAILABLE" -> count
    info: Info  # what the scaler said of itself
    latency: Latency | None = None  # the scaler's own latency in this run, when asked for (`run_live(latency=...)`)


async def run_live(
    dataset: Dataset,
    gateway: str,
    speed: float = 1.0,
    platform_listen: str = "127.0.0.1:50051",
    create_latency_ms: int = 100,
    progress: Progress | None = None,
    stats_listen: str | None = None,
    said: Callable[[str], None] = lambda line: None,
    began: Callable[[LiveRun], None] = lambda driver: None,
    gateway_tls: tls.ClientTls | None = None,
    platform_tls: tls.ServerTls | None = None,
    latency: bool = False,
    events: str | None = None,
) -> "LiveOutcome":
    """Serve the Platform API on `platform_listen` and drive the scaler at `gateway`.

    `latency`: measure the run's latency model (`LiveOutcome.latency`; speed 1 only) on this run's records and
    the scaler's EVENTS, at `events` (a NATS URL) or where the scaler says they are; a scaler that does not say
    (not ours) is measured on the records alone (scaler/simulator/latency.py, `from_records`).

    The setup is checked before the first request: the scaler's speed (when it says it) and, at
    its first answer, that it uses this platform. With `stats_listen`, the statistics so far are
    served there over HTTP (`/stats`, JSON) while the run goes on; `said` is told where. `gateway_tls` and
    `platform_tls` put the two hops on TLS (scaler/runtime/tls.py). `began` is given
    the run once it begins, so that a caller can report the requests done so far if it is interrupted.
    """
    clock = Clock(speed)
    stub = PlatformStub(platform_listen, dataset.metas, create_latency_ms, clock, tls=platform_tls)
    try:
        await stub.start()
    except CannotListen as e:
        await stub.stop()
        raise LiveError(f"cannot serve the Platform API on {platform_listen}: {e.why}") from None
    stats: HttpEndpoint | None = None
    try:
        async with tls.channel(gateway, gateway_tls, options=CHANNEL_OPTIONS) as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), GATEWAY_WAIT_S)
            except TimeoutError:
                raise LiveError(
                    f"no scaler gateway answers at {gateway} (waited {GATEWAY_WAIT_S:g}s); is `scaler up` running?"
                ) from None
            try:
                info = await ask(gateway, GATEWAY_WAIT_S, channel)
            except NoAnswer as e:
                raise LiveError(str(e)) from None
            if info.speed is not None and info.speed != speed:
                raise LiveError(
                    f"the scaler at {gateway} runs at speed {info.speed:g} and this simulation at {speed:g}:"
                    " start both with the same --speed"
                )
            if held := info.instances:  # an earlier run's, interrupted or finished: its platform is gone
                raise LiveError(
                    f"the scaler at {gateway} holds {held:,} instance{'s' if held > 1 else ''} of an earlier run, whose"
                    f" platform is gone. {fresh_scaler(stub.port, speed)}"
                )
            driver = LiveRun(dataset, pb_grpc.ScalerStub(channel), stub, clock, progress)
            began(driver)  # the caller can tell how far it came, should the run be cut short
            if stats_listen is not None:
                stats = HttpEndpoint(stats_listen, {"/stats": driver.stats_page}, "statistics")
                try:
                    await stats.start()
                except CannotListen as e:
                    raise LiveError(f"cannot serve the statistics on {stats_listen}: {e.why}") from None
                said(f"statistics so far: http://{_reachable(stats_listen)}:{stats.port}/stats")
            run = await driver.run()
            await _platform_quiet(stub, dataset)
            model = await _latency(driver, events or info.nats, speed, gateway) if latency else None
    finally:
        if stats is not None:
            await stats.stop()
        await stub.stop()
    return LiveOutcome(run, driver.errors(), driver.retried, info, model)


async def _latency(driver: LiveRun, url: str, speed: float, gateway: str) -> Latency:
    """The run's latency model, from its records and the scaler's EVENTS at `url` (none: its records alone)."""
    if speed != 1:
        raise LiveError("a latency model is measured at speed 1 only: the scaler's own time is not sped up")
    batches = None
    if url:
        try:
            batches = await read_batches(url)
        except Exception as e:  # any failure to read says the same: no model
            raise LiveError(f"cannot read the scaler's events at {url} for the latency model: {e}") from None
    source = f"{driver.dataset.name}, live at speed 1 against {gateway}"
    return measure(driver.call_times(), driver.slot_times(), batches, source)


def _reachable(listen: str) -> str:
    host = listen.rpartition(":")[0].strip("[]")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


__all__ = ["LiveError", "LiveRun", "run_live"]
