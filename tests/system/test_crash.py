"""Crash recovery on real processes: kill -9 a part mid-run, start it again, and nothing is lost.

Each test checks the same things at the end: every request was answered once (one arrival,
one assignment), no instance was handed to two requests at once, the platform's live slots are
exactly the state's instances, and the running controller's state equals the replayed stream.
Nothing waits a fixed time: each step waits for what it needs to see. Each prints how long
recovery took (run with -s to see it).
"""

import asyncio
import io
import os
import signal
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from scaler import replay
from scaler.controller.core.state import Phase
from scaler.controller.leases import LEASES, bucket, holders
from scaler.platform_stub.server import MODES, PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.events import Assigned, Released
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.simulator.dataset import FunctionMeta, load_dataset
from tests.nemesis import Link
from tests.processes import (
    Call,
    Driver,
    Parts,
    TraceCallers,
    controller_state,
    held_once_settled,
    overlaps,
    settled,
    slots_of,
)
from tests.stack import eventually


async def check_the_log(nats_url: str, driver: Driver, extra_arrivals: int = 0) -> None:
    """One arrival and at most one assignment per request; the running state equals the replay."""
    async with connected(nats_url, "test") as nc:
        assigned: Counter[str] = Counter()

        def count(seq, batch):
            assigned.update(e.request_id for e in batch.events if isinstance(e, Assigned))

        replayed = await replay.replay(nc, seen=count)
        assert assigned and max(assigned.values()) == 1, [r for r, n in assigned.items() if n > 1]
        answered = {c.request_id for c in driver.calls if c.instance}
        assert answered <= set(assigned)
        arrivals = sum(f.arrivals for f in replayed.ledger.features.values())
        assert arrivals == len(driver.calls) + extra_arrivals
        out = io.StringIO()
        assert await replay.verify(nc, None, out) == 0, out.getvalue()


@pytest.fixture
async def stub():
    metas = {"slow-init": FunctionMeta(key="slow-init", runtime="python", memory_in_mb=128, init_duration_in_ms=3000)}
    platform = PlatformStub("127.0.0.1:0", metas, create_latency_ms=50, like_challenge=True)
    await platform.start()
    yield platform
    await platform.stop()


async def assign(gateway: str, request_id: str, key: str = "fa", attempts: int = 1) -> pb.AssignReply:
    """One Assign, repeated (same request id) while the scaler is unavailable, up to `attempts` times."""
    meta = pb.Meta(key=key, runtime="python", memory_in_mb=128)
    for n in range(attempts):
        async with grpc.aio.insecure_channel(gateway) as channel:
            try:
                return await pb_grpc.ScalerStub(channel).Assign(
                    pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=60
                )
            except grpc.aio.AioRpcError as e:
                if e.code() is not grpc.StatusCode.UNAVAILABLE or n == attempts - 1:
                    raise
        await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


async def test_node_killed_mid_run(tmp_path, stub):
    """Calls in flight get a clear error; the caller's retry (same request id) is served once."""
    async with NatsServer(tmp_path / "nats") as nats:
        platform = f"127.0.0.1:{stub.port}"
        async with Parts(nats.url, platform) as parts:
            driver = Driver(parts.gateway, retry_assign=True)
            load = asyncio.create_task(driver.run())
            await eventually(lambda: sum(1 for c in driver.calls if c.idle_at) > 30)
            await parts.kill("node")
            killed_at = time.monotonic()
            # While it is down, a client asks twice for the same request (a retry): one request in effect.
            retried = asyncio.gather(*(assign(parts.gateway, "dup-1", attempts=40) for _ in range(2)))
            restart_s = await parts.start("node")
            first, second = await retried
            assert first.assigment.instance_id == second.assigment.instance_id
            again = await assign(parts.gateway, "dup-1")  # and once more after the answer
            assert again.assigment.instance_id == first.assigment.instance_id
            await eventually(lambda: sum(1 for c in driver.calls if c.got_at > killed_at) > 30, seconds=30)
            driver.stop()
            await load
            answered_after = min(c.got_at for c in driver.calls if c.got_at > killed_at) - killed_at
            print(f"\nnode kill -9: ready {restart_s:.2f}s after start, answering {answered_after:.2f}s after kill")
            assert [c.error for c in driver.calls if c.error] == []
            assert sum(c.retries for c in driver.calls) > 0, "the kill reached calls in flight"
            assert driver.overlaps() == []
            await settled(nats.url, stub)
            await check_the_log(nats.url, driver, extra_arrivals=1)


async def test_node_killed_behind_a_front_gateway(tmp_path, stub):
    """Through a front gateway, a call in flight when the node dies gets its answer after the retry."""
    async with NatsServer(tmp_path / "nats") as nats:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", front=True) as parts:
            driver = Driver(parts.gateway)  # no retries of its own: the front gateway retries
            load = asyncio.create_task(driver.run())
            await eventually(lambda: sum(1 for c in driver.calls if c.idle_at) > 30)
            await parts.kill("node")
            killed_at = time.monotonic()
            await parts.start("node")
            await eventually(lambda: sum(1 for c in driver.calls if c.got_at > killed_at) > 30, seconds=30)
            driver.stop()
            await load
            answered_after = min(c.got_at for c in driver.calls if c.got_at > killed_at) - killed_at
            print(f"\nnode kill -9 behind a front gateway: answering {answered_after:.2f}s after kill")
            assert [c.error for c in driver.calls if c.error] == []
            assert driver.overlaps() == []
            await settled(nats.url, stub)
            await check_the_log(nats.url, driver)


@pytest.mark.parametrize("during", ["CreateSlot", "Init"])
async def test_platform_worker_killed_mid_call(tmp_path, stub, during):
    stub.create_latency_ms = 3000 if during == "CreateSlot" else 50
    key = "slow-init" if during == "Init" else "fa"
    async with NatsServer(tmp_path / "nats") as nats:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
            pending = asyncio.create_task(assign(parts.gateway, "r1", key))
            in_init = during == "Init"
            await eventually(lambda: any(bool(r.instance_id) == in_init for r in stub.accounting.live.values()))
            await parts.kill("platform_worker")
            killed_at = time.monotonic()
            await parts.start("platform_worker")
            reply = await pending
            print(f"\nplatform worker kill -9 during {during}: answered {time.monotonic() - killed_at:.2f}s after kill")
            assert reply.assigment.instance_id == f"{key}-1"
            states = await settled(nats.url, stub)  # no slot leaked: the platform's are exactly the state's
            assert set(stub.accounting.live) == {states[key].instances[f"{key}-1"].slot_id}
            # CreateSlot: the first slot went with its caller; Init: the first slot, whose Init may have run and the
            # platform cannot say, was replaced and destroyed, without a second Init on it (the platform would refuse
            # it, and count it as an error).
            assert stub.accounting.created == 2 and stub.accounting.inits == (2 if in_init else 1)
            assert stub.accounting.refused_inits == []
            assert len({slot for slot, _ in stub.accounting.init_calls}) == len(stub.accounting.init_calls)
            await check_the_log(nats.url, Driver(parts.gateway, calls=[Call("r1", key, reply.assigment.instance_id)]))


@pytest.mark.parametrize("during", ["Init", "its report"])
async def test_a_dead_workers_init_is_found_where_the_platform_lists_its_slots(tmp_path, during):
    """A worker killed during Init, or once Init answered and before its report is stored (its link to NATS cut
    as the answer goes out): on a platform that lists its slots (with the instance Init was asked for and whether
    it finished) the next worker finds that Init, waits for it or reports it, and never sends a second one."""
    metas = {"slow-init": FunctionMeta(key="slow-init", runtime="python", memory_in_mb=128, init_duration_in_ms=3000)}
    stub = PlatformStub("127.0.0.1:0", metas, create_latency_ms=50, mode=MODES["list"])
    await stub.start()
    try:
        async with NatsServer(tmp_path / "nats") as nats, Link("127.0.0.1", nats.port) as link:
            env = {"platform_worker": {"SCALER_NATS_URL": link.url}}
            async with Parts(nats.url, f"127.0.0.1:{stub.port}", env=env) as parts:
                if during == "its report":
                    stub.faults.inited = lambda _: setattr(link, "cut", True)
                pending = asyncio.create_task(assign(parts.gateway, "r1", "slow-init"))
                if during == "Init":
                    await eventually(lambda: any(r.instance_id for r in stub.accounting.live.values()))
                else:
                    await eventually(lambda: link.cut)
                    await asyncio.sleep(0.5)  # the answer is in, its report held by the cut link
                await parts.kill("platform_worker")
                link.cut = False
                await parts.start("platform_worker")
                reply = await pending
                assert reply.assigment.instance_id == "slow-init-1"
                assert stub.accounting.created == 1 and len(stub.accounting.init_calls) == 1
                assert stub.accounting.refused_inits == []
                states = await settled(nats.url, stub)
                assert set(stub.accounting.live) == {states["slow-init"].instances["slow-init-1"].slot_id}
                calls = [Call("r1", "slow-init", reply.assigment.instance_id)]
                await check_the_log(nats.url, Driver(parts.gateway, calls=calls))
    finally:
        await stub.stop()


@pytest.mark.parametrize("mode", ["kind", "dedupe", "list", "bare"])
async def test_a_worker_killed_during_create_slot_leaks_nothing_where_the_platform_promises_it(tmp_path, mode):
    """docs/faults.md, "What the platform must do": a platform that dedupes request ids answers the repeated
    CreateSlot with the slot the dead worker's call made; one that lists its slots lets the next worker find it
    by its request id and take it; one that does neither (`bare`) keeps it, and nothing names it. (One that tears a
    vanished CreateSlot down is the challenge's: test_platform_worker_killed_mid_call.)"""
    stub = PlatformStub("127.0.0.1:0", create_latency_ms=1000, mode=MODES[mode])
    await stub.start()
    reconcile = ("--reconcile-every", "1", "--reconcile-grace", "3")  # above CreateSlot's 1 s
    try:
        async with NatsServer(tmp_path / "nats") as nats:
            async with Parts(nats.url, f"127.0.0.1:{stub.port}", worker_args=reconcile) as parts:
                pending = asyncio.create_task(assign(parts.gateway, "r1"))
                await eventually(lambda: any(not r.created_done_ms for r in stub.accounting.live.values()))
                await parts.kill("platform_worker")
                await parts.start("platform_worker")
                reply = await pending
                assert stub.accounting.created == (1 if MODES[mode].dedupes or MODES[mode].lists else 2)
                if mode == "bare":
                    states = (await controller_state(nats.url)).states
                    leaked = set(stub.accounting.live) - slots_of(states)
                    assert [stub.accounting.live[s].request_id.split("@")[0] for s in leaked] == ["fa-1"], leaked
                    return
                states = await settled(nats.url, stub)  # no slot leaked: the platform's are exactly the state's
                assert set(stub.accounting.live) == {states["fa"].instances["fa-1"].slot_id}
                calls = [Call("r1", "fa", reply.assigment.instance_id)]
                await check_the_log(nats.url, Driver(parts.gateway, calls=calls))
    finally:
        await stub.stop()


class SlowDestroy(PlatformStub):
    """DestroySlot takes a while, so a test can kill the gc worker while one is in flight."""

    destroying = 0

    async def DestroySlot(self, request, context):
        self.destroying += 1
        await asyncio.sleep(2)
        return await super().DestroySlot(request, context)


async def test_gc_worker_killed_mid_destroy(tmp_path):
    stub = SlowDestroy("127.0.0.1:0", create_latency_ms=50, like_challenge=True)
    await stub.start()
    try:
        async with NatsServer(tmp_path / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
            reply = await assign(parts.gateway, "r1")
            async with grpc.aio.insecure_channel(parts.gateway) as channel:
                result = pb.Result(status_code=500, need_destroy=True)
                await pb_grpc.ScalerStub(channel).Idle(pb.IdleRequest(assigment=reply.assigment, result=result))
            await eventually(lambda: stub.destroying)
            await parts.kill("gc_worker")
            killed_at = time.monotonic()
            assert len(stub.accounting.live) == 1, "the call died with the worker"
            await parts.start("gc_worker")
            states = await settled(nats.url, stub)
            print(f"\ngc worker kill -9 during DestroySlot: slot gone {time.monotonic() - killed_at:.2f}s after kill")
            assert stub.accounting.live == {} and stub.accounting.destroyed == 1
            assert all(not s.instances for s in states.values())
            await check_the_log(nats.url, Driver(parts.gateway, calls=[Call("r1", "fa", reply.assigment.instance_id)]))
    finally:
        await stub.stop()


async def test_nats_restarted_with_its_store(tmp_path, stub):
    nats = NatsServer(tmp_path / "nats")
    await nats.start()
    try:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", reply_timeout_s=10) as parts:
            # Callers that repeat a refused Idle for 30 s, as a platform does: one that gave up after the default
            # 5 s (on a node loaded enough to take longer to serve again) would leave its instance held till its lease.
            driver = Driver(parts.gateway, timeout_s=30, attempts=120)
            load = asyncio.create_task(driver.run())
            await eventually(lambda: sum(1 for c in driver.calls if c.idle_at) > 30)
            await nats.stop()
            down_at = time.monotonic()
            await eventually(lambda: any(c.error or c.retries for c in driver.calls), seconds=20)  # the outage is felt
            await nats.start()  # again: the same port, the same store
            up_at = time.monotonic()
            # Serving again: a fresh request is answered.
            async with asyncio.timeout(30):
                while True:
                    probe = Call(f"probe-{time.monotonic()}", "fa")
                    await Driver(parts.gateway, timeout_s=5, attempts=120).one_on(probe)
                    if not probe.error:
                        break
                    await asyncio.sleep(0.2)
            serving_s = time.monotonic() - up_at
            # The clients that were mid-call when NATS went away carry on too.
            await eventually(lambda: sum(1 for c in driver.calls if c.got_at > up_at) > 20, seconds=20)
            driver.stop()
            await load
            errors = [c.error for c in driver.calls if c.error]
            retried = sum(c.retries for c in driver.calls)
            print(
                f"\nnats restart: down {up_at - down_at:.1f}s, serving again {serving_s:.2f}s after it came back;",
                end=" ",
            )
            print(f"{len(errors)} of {len(driver.calls)} calls refused (a clear error), {retried} Idle retries")
            late = [c for c in driver.calls if c.got_at and c.got_at < down_at and not c.idle_at]
            assert all(e.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED: no answer within")) for e in errors), errors
            assert not late
            assert driver.overlaps() == []
            held = await held_once_settled(nats.url, stub)  # a release lost holds its instance for 15 min
            calls = {c.request_id: c for c in driver.calls}

            def told(c: Call | None) -> str:
                if c is None:
                    return "a probe"
                if c.error:
                    return f"its caller gave up: {c.error}"
                if not c.idled_at:
                    return "its Idle never answered"
                when = f"{c.idled_at - down_at:+.2f}s from NATS's stop (down {up_at - down_at:.1f}s)"
                return f"its Idle answered OK {when}, after {len(c.refusals)} refusals: its release was lost"

            holders = [(i.id, i.request_id, told(calls.get(i.request_id))) for i in held]
            assert held == [], f"held 10 s after settling: {holders}"
            async with connected(nats.url, "test") as nc:
                out = io.StringIO()
                assert await replay.verify(nc, None, out) == 0, out.getvalue()
    finally:
        await nats.stop()


def frozen(pid: int) -> None:
    """SIGSTOP, and wait until the process is stopped indeed (its threads stop a moment later)."""
    os.kill(pid, signal.SIGSTOP)
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.001)


async def test_a_caller_that_gave_up_while_nats_was_frozen_leaves_nothing_held(tmp_path, stub):
    """NATS frozen (a stalled machine): the node's append of an Assign gets no answer, so the caller is told
    UNAVAILABLE and the Assign cancelled; but NATS stores the batch when it thaws. The node must not decide
    the Cancel, or anything else of that function, on a state that lacks that batch."""
    async with NatsServer(tmp_path / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        await assign(parts.gateway, "warm-up")  # the stream, the consumers and the leases are in place
        frozen(nats._proc.pid)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await assign(parts.gateway, "r1", key="fb")
        finally:
            nats._proc.send_signal(signal.SIGCONT)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        async with asyncio.timeout(30):  # the stored Assign got its instance, and its Cancel freed it
            while True:
                states = await settled(nats.url, stub)
                fb = states.get("fb")
                if fb is not None and not fb.in_flight() and fb.in_phase(Phase.IDLE):
                    break
                await asyncio.sleep(0.2)
        assert [i.phase for i in fb.instances.values()] == [Phase.IDLE]


async def test_an_idle_while_nats_stands_still_is_answered_and_its_instance_waits_for_the_release_stored(
    tmp_path, stub
):
    """NATS frozen: an Idle is answered OK at once (its release is taken, and stored once NATS runs again), while a
    request that would take the freed instance waits until that release is stored. The caller's repeat of the Idle,
    once another request holds the instance, is OK too: the release is recorded. (The demo policy keeps the
    instance through the freeze.)"""
    platform = f"127.0.0.1:{stub.port}"
    async with NatsServer(tmp_path / "nats") as nats, Parts(nats.url, platform, policy="demo") as parts:
        first = await assign(parts.gateway, "r1")
        async with grpc.aio.insecure_channel(parts.gateway) as channel:
            scaler = pb_grpc.ScalerStub(channel)
            done = pb.IdleRequest(assigment=first.assigment, result=pb.Result(status_code=200, duration_in_ms=5))
            frozen(nats._proc.pid)
            try:
                assert (await scaler.Idle(done, timeout=60)).status == pb.Ok
                second = asyncio.create_task(assign(parts.gateway, "r2"))  # waits for the release to be stored
                finished, _ = await asyncio.wait({second}, timeout=1.0)
                assert not finished, "handed out the instance on a release not yet stored"
            finally:
                nats._proc.send_signal(signal.SIGCONT)
            assert (await second).assigment.instance_id == first.assigment.instance_id, "r1's Idle was stored"
            assert (await scaler.Idle(done, timeout=30)).status == pb.Ok
        states = await settled(nats.url, stub)
        assert states["fa"].instances["fa-1"].request_id == "r2" and states["fa"].instances["fa-1"].busy


SMOKE = Path(__file__).parents[1] / "fixtures" / "function_smoke_test"


@pytest.mark.live_trace
async def test_smoke_test_callers_retrying_through_a_nats_restart_mid_burst_are_each_served_once(tmp_path):
    """The challenge's smoke test, every caller repeating its call (same request id) while the scaler is
    unavailable, NATS killed and restarted with its store in the middle of the burst: every request is
    answered with an instance it holds alone, every Idle succeeds, and no slot is left behind."""
    smoke = load_dataset(SMOKE)
    stub = PlatformStub("127.0.0.1:0", smoke.metas, create_latency_ms=100, like_challenge=True)
    await stub.start()
    nats = NatsServer(tmp_path / "nats")
    await nats.start()
    try:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", reply_timeout_s=10) as parts:
            callers = TraceCallers(parts.gateway, smoke, attempt_s=2)  # impatient: many calls given up and repeated
            run = asyncio.create_task(callers.run())
            await eventually(lambda: len(callers.calls) > 300, seconds=30)  # 121 before the burst, 859 in it
            await nats.stop(kill=True)
            await eventually(lambda: callers.refusals, seconds=30)  # the outage is felt
            await nats.start()  # again: the same port, the same store
            await run
            print(f"\nsmoke test through a NATS restart: calls repeated {dict(callers.refusals)}")
            assert [c.error for c in callers.calls if c.error] == []
            assert all(c.instance for c in callers.calls) and overlaps(callers.calls) == []
            held = await held_once_settled(nats.url, stub, seconds=60)  # no slot leaked
            assert [(i.id, i.request_id) for i in held] == [], "held 10 s after settling: a release lost"
            async with connected(nats.url, "test") as nc:
                served: Counter[str] = Counter()

                def count(seq, batch):
                    served.update(e.request_id for e in batch.events if isinstance(e, Assigned))
                    served.subtract(e.request_id for e in batch.events if isinstance(e, Released) and e.cancelled)

                await replay.replay(nc, seen=count)
                assert set(served.values()) == {1}, "each request served once, not counting cancelled assignments"
                out = io.StringIO()
                assert await replay.verify(nc, None, out) == 0, out.getvalue()
    finally:
        await nats.stop()
        await stub.stop()


async def test_node_killed_between_an_idles_answer_and_its_storage(tmp_path, stub):
    """An Idle is answered as soon as its release is decided, its batch stored right behind. Broken here: the
    node's link to NATS is cut before the Idle, so the answer goes out and the release never reaches the store,
    then the node is killed. Rebuilt from the stream, the instance is still held by its request: nobody else is
    given it, and once the request is older than the function's timeout the node retires it and its slot is
    destroyed. Nothing assigned twice, no slot leaked, replay equal to the state."""
    timeout_s = 8
    meta = pb.Meta(key="fi", runtime="python", memory_in_mb=128, timeout_in_secs=timeout_s)
    async with NatsServer(tmp_path / "nats") as nats, Link("127.0.0.1", nats.port) as link:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=("--nats", link.url)) as parts:
            async with grpc.aio.insecure_channel(parts.gateway) as channel:
                scaler = pb_grpc.ScalerStub(channel)
                first = await scaler.Assign(pb.AssignRequest(request_id="r1", meta_data=meta), timeout=30)
                held = first.assigment.instance_id
                link.cut = True  # nothing the node sends reaches NATS from now on
                result = pb.Result(status_code=200, duration_in_ms=5)
                answer = await scaler.Idle(pb.IdleRequest(assigment=first.assigment, result=result), timeout=10)
                assert answer.status == pb.Ok  # answered while its release could not be stored
            await parts.kill("node")
            link.cut = False
            await parts.start("node")
            async with grpc.aio.insecure_channel(parts.gateway) as channel:
                second = await pb_grpc.ScalerStub(channel).Assign(
                    pb.AssignRequest(request_id="r2", meta_data=meta), timeout=30
                )
            assert second.assigment.instance_id != held, "handed out on a release that was never stored"
            made_for = [s.request_id.split("@")[0] for s in stub.accounting.live.values()]
            assert held in made_for  # its slot lives on meanwhile
            await eventually(
                lambda: held not in [s.request_id.split("@")[0] for s in stub.accounting.live.values()], seconds=60
            )
            await settled(nats.url, stub)
            async with connected(nats.url, "test") as nc:
                told: list[str] = []

                def look(seq, batch):
                    told.extend(
                        f"{d.cause}: {type(e).__name__}"
                        for d in batch.decisions()
                        for e in d.events
                        if getattr(e, "instance_id", None) == held
                    )

                await replay.replay(nc, seen=look)
                out = io.StringIO()
                assert await replay.verify(nc, None, out) == 0, out.getvalue()
            assert told.count("assign:r1: Assigned") + told.count("ready:fi-1: Assigned") == 1, told
            assert not any(t.startswith("idle:r1") for t in told), f"the lost release was stored after all: {told}"
            released = [t for t in told if t.endswith((": Released", ": InstanceRetired"))]
            assert len(released) == 2 and all(t.startswith(("tick", "plan", "reconcile")) for t in released), told


async def test_a_node_killed_and_started_again_under_its_name_serves_before_its_leases_could_lapse(tmp_path, stub):
    """With `--node-dir` (as `scaler up --data-dir` gives it) a restarted node takes its dead incarnation's leases
    back at once. The leases here last 60 s, so a node that waited for them to lapse would serve nothing for that
    long."""
    async with NatsServer(tmp_path / "nats") as nats:
        async with connected(nats.url, "test") as nc:
            await bucket(nc.jetstream(), LEASES, ttl_s=60, replicas=1)
        args = ("--node-dir", str(tmp_path / "node"))
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=args) as parts:
            name = (tmp_path / "node" / "name").read_text().strip()
            await assign(parts.gateway, "r1", attempts=20)
            await parts.kill("node")
            await parts.start("node")
            reply = await assign(parts.gateway, "r2", attempts=40)  # served within the 10 s of its repeats
            async with connected(nats.url, "test") as nc:
                assert set((await holders(nc.jetstream())).values()) == {name}
            await settled(nats.url, stub)
            calls = [Call("r1", "fa"), Call("r2", "fa", reply.assigment.instance_id)]
            await check_the_log(nats.url, Driver(parts.gateway, calls=calls))
