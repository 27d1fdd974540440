"""The simulator scores failures as the challenge did: each cause counted, and a run below 99.95 % scores 0.

The live cases run against a Scaler that misbehaves on purpose (a fake of our side, built here),
so that every way an answer can be wrong reaches the simulator's checks.
"""

import asyncio

import grpc
import pytest

from scaler.controller.core.policy import POLICIES, get_policy
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.clock import Clock
from scaler.simulator.dataset import load_dataset
from scaler.simulator.live import LiveRun
from scaler.simulator.offline import simulate
from scaler.simulator.score import Failure, Invocation, summarize
from tests.simulator.test_simulate import meta, request, write_dataset


def runs(n: int, failed: int) -> list[Invocation]:
    ok = Invocation("f", 1024, 1000, schedule_ms=0.0, idle_ms=0.0, cold=False)
    bad = Invocation("f", 1024, 1000, 0.0, 0.0, False, failure=Failure.ASSIGN_ERROR)
    return [ok] * (n - failed) + [bad] * failed


def test_a_run_scores_0_below_99_95_percent_success():
    at_threshold = summarize(runs(2000, failed=1), slot_gb_s=4000.0, slots_created=1)
    assert at_threshold.success_rate == 0.9995
    assert at_threshold.score == pytest.approx(at_threshold.resource_usage_score + at_threshold.cold_start_score)
    assert at_threshold.score == pytest.approx(50 * 1999 / 4000 + 50)
    below = summarize(runs(2000, failed=2), slot_gb_s=4000.0, slots_created=1)
    assert below.failures_by_cause == {**dict.fromkeys(Failure, 0), Failure.ASSIGN_ERROR: 2}
    assert below.score == 0.0
    assert below.resource_usage_score > 0 and below.cold_start_score > 0  # still said: what it would have scored


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_request_outliving_its_instance_fails_and_its_execution_does_not_count(tmp_path, policy):
    # Runs of 40 s on a function whose timeout is 1 s: the core frees the instance 31 s into each
    # run (the lease: timeout + 30 s) and its slot is destroyed. Counting those runs as executions
    # gave a resource score of 64 (total 114); each is a request whose slot went away under it.
    a = {**meta("a", memory=1024, init=100), "timeoutInSecs": 1}
    folder = write_dataset(tmp_path / "d", [a], [request(n * 60_000, "a", duration=40_000) for n in range(5)])
    stats = simulate(load_dataset(folder), get_policy(policy)).stats()
    assert stats.failures_by_cause[Failure.SLOT_LOST] == stats.failed_requests_count == 5
    assert stats.invocation_execution_time_in_g_bs == 0
    assert stats.score == 0


def test_offline_charges_slots_until_the_end_of_the_run(tmp_path):
    # One request: the demo keeps its instance 5 minutes, longer than the run lasts, so the slot
    # is charged from CreateSlot (t = 0) to the end of the run: the Idle at 0.1 + 0.05 + 1, and 20 s.
    folder = write_dataset(tmp_path / "d", [meta("a", memory=2048, init=50)], [request(0, "a", duration=1000)])
    dataset = load_dataset(folder)
    assert simulate(dataset, get_policy("demo")).slot_gb_s == pytest.approx(2 * 21.15)
    assert simulate(dataset, get_policy("demo"), tail_ms=0).slot_gb_s == pytest.approx(2 * 1.15)


# Live: a Scaler that gets each request wrong in its own way, by the request's number in the trace.

GOOD, UNKNOWN, NOT_READY, HELD, ERROR, IDLE_ERROR, LOST, REUSE = range(8)


class Misbehaving(pb_grpc.ScalerServicer):
    """Starts its instances on the simulator's platform, but answers each request as `Assign` says."""

    def __init__(self, platform: pb_grpc.PlatformStub) -> None:
        self.platform = platform
        self.slots: dict[str, str] = {}  # instance -> slot
        self.background: set[asyncio.Task] = set()

    async def start(self, instance: str, meta: pb.Meta, wait_for_init: bool = True) -> None:
        config = pb.ResourceConfig(memory_in_megabytes=meta.memory_in_mb)
        slot = (await self.platform.CreateSlot(pb.CreateSlotRequest(request_id=instance, resource_config=config))).slot
        self.slots[instance] = slot.id
        init = self.platform.Init(
            pb.InitRequest(request_id=instance, slot_id=slot.id, instance_id=instance, meta_data=meta)
        )
        if wait_for_init:
            await init
        else:  # answer 50 ms into the Init's 300
            self.later(init)
            await asyncio.sleep(0.05)

    def later(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def destroy_soon(self, instance: str) -> None:
        await asyncio.sleep(0.2)
        await self.platform.DestroySlot(pb.DestroySlotRequest(request_id=instance, id=self.slots[instance]))

    async def Assign(self, request: pb.AssignRequest, context) -> pb.AssignReply:
        n = int(request.request_id.rsplit("-", 1)[1])
        instance = {UNKNOWN: "ghost", HELD: "good", REUSE: "good"}.get(n, f"instance-{n}")
        match n:
            case 0:
                instance = "good"
                await self.start(instance, request.meta_data)
            case 2:
                await self.start(instance, request.meta_data, wait_for_init=False)
            case 4:
                await context.abort(grpc.StatusCode.INTERNAL, "no capacity")
            case 5 | 6:
                await self.start(instance, request.meta_data)
                if n == LOST:
                    self.later(self.destroy_soon(instance))
        assignment = pb.Assignment(request_id=request.request_id, meta_key=request.meta_data.key, instance_id=instance)
        return pb.AssignReply(status=pb.Ok, assigment=assignment)

    async def Idle(self, request: pb.IdleRequest, context) -> pb.IdleReply:
        if request.assigment.instance_id == f"instance-{IDLE_ERROR}":
            await context.abort(grpc.StatusCode.NOT_FOUND, "lost track of it")
        return pb.IdleReply(status=pb.Ok)


async def test_live_counts_each_way_an_answer_can_be_wrong(tmp_path):
    # At speed 1, on the clock: "good" runs request 0 from about 0.4 s to 1.9 s; requests 1-6
    # come meanwhile, 100 ms apart; request 7 comes at 3 s, when "good" is free again.
    starts = {GOOD: 0, UNKNOWN: 600, NOT_READY: 700, HELD: 800, ERROR: 900, IDLE_ERROR: 1000, LOST: 1100, REUSE: 3000}
    durations = {GOOD: 1500, LOST: 1000}
    folder = write_dataset(
        tmp_path / "d",
        [meta("a", memory=1024, init=300)],
        [request(t, "a", duration=durations.get(n, 100)) for n, t in starts.items()],
    )
    dataset = load_dataset(folder)
    clock = Clock()
    platform = PlatformStub("127.0.0.1:0", dataset.metas, 100, clock)
    await platform.start()
    server = grpc.aio.server()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{platform.port}") as to_platform:
            scaler = Misbehaving(pb_grpc.PlatformStub(to_platform))
            pb_grpc.add_ScalerServicer_to_server(scaler, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                driver = LiveRun(dataset, pb_grpc.ScalerStub(channel), platform, clock, tail_ms=0)
                run = await driver.run()
            await asyncio.gather(*scaler.background)
    finally:
        await server.stop(grace=None)
        await platform.stop()
    failures = [i.failure for i in run.invocations]
    assert failures == [
        None,
        Failure.UNKNOWN_INSTANCE,
        Failure.NOT_INITIALISED,
        Failure.HELD,
        Failure.ASSIGN_ERROR,
        Failure.IDLE_ERROR,
        Failure.SLOT_LOST,
        None,
    ]
    stats = run.stats()
    assert stats.failures_by_cause == dict.fromkeys(Failure, 1)
    assert stats.success_rate == pytest.approx(2 / 8)
    assert stats.score == 0
    # Only the two that ran count as executions: 1.5 s and 0.1 s at 1 GB.
    assert stats.invocation_execution_time_in_g_bs == pytest.approx(1.6)
    assert driver.errors() == {"INTERNAL: no capacity": 1, "NOT_FOUND: lost track of it": 1}
