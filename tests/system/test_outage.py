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
from scaler.proto.events import Assigned, Released
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.simulator.dataset import FunctionMeta
from tests.processes import Parts
from tests.stack import Stack, eventually
from tests.system.test_crash import assign, frozen


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


async def test_every_call_waiting_on_a_stalled_store_is_refused_unavailable_within_the_bound(tmp_path):
    """Issue 41, item 4: with NATS stopped (SIGSTOP), an append gets no answer; the writer tries it again for 10 s
    and the function's other commands wait behind it, so callers with a usual deadline ran it out and never
    learned the store was away. Each call, the one whose append is in flight and those queued behind it, is
    refused UNAVAILABLE once it has waited the node's --store-wait (1 s here): all of them are answered while NATS
    is still stopped, well within their 8 s deadline. Once NATS is back the same calls are served, once each."""
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url, lease_ttl_s=60, store_wait_s=1.0) as stack:
        await stack.idle(await stack.assign("warm", key="fa"))
        held = await stack.assign("held", key="fa")  # its Idle comes during the stall
        await stack.settled()

        async def call(request_id: str) -> str:
            meta = pb.Meta(key="fa", runtime="python", timeout_in_secs=60, memory_in_mb=256)
            try:
                await stack.scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=8)
            except grpc.aio.AioRpcError as e:
                return f"{e.code().name}: {e.details()}"
            return "OK"

        os.kill(nats.proc.pid, signal.SIGSTOP)
        try:
            first = asyncio.create_task(call("r0"))  # its append goes out and hangs; the others queue behind it
            await asyncio.sleep(0.3)
            idle = asyncio.create_task(stack.idle(held))
            rest = [asyncio.create_task(call(f"r{n}")) for n in range(1, 6)]
            async with asyncio.timeout(20):  # NATS stays stopped until every caller has its answer
                outcomes = await asyncio.gather(first, *rest)
                await asyncio.wait({idle})
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        assert all(o.startswith("UNAVAILABLE") for o in outcomes), outcomes
        assert "did not store it within 1s" in outcomes[-1]
        # The Idle's release was decided and answered at once (an Idle waits for nothing stored), or refused too.
        assert idle.exception() is None or idle.exception().code() is grpc.StatusCode.UNAVAILABLE
        for n in range(6):  # the callers repeat: served now, each once
            assert (await stack.assign(f"r{n}", key="fa")).assigment.instance_id
        await stack.settled()
        async with connected(nats.url, "test") as nc:
            assert await assigned_while_held(nc) == []
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 0, out.getvalue()


async def assigned_while_held(nc) -> list[str]:
    """Requests the stream assigns again while their instance still holds them: never. One assigned, then released
    (its caller refused UNAVAILABLE after its assignment was decided, the gateway's Cancel freeing it), may be
    assigned again when its caller repeats."""
    held: set[str] = set()
    twice: list[str] = []

    def seen(_, batch) -> None:
        for event in batch.events:
            if isinstance(event, Assigned):
                if event.request_id in held:
                    twice.append(event.request_id)
                held.add(event.request_id)
            elif isinstance(event, Released):
                held.discard(event.request_id)

    await replay.replay(nc, seen=seen)
    return twice


async def test_an_assign_waiting_for_its_instance_while_the_store_stalls_is_refused_unavailable_within_the_bound(
    tmp_path,
):
    """Issue 41, item 4: an Assign already stored, waiting for its instance (a 3 s Init), when NATS is stopped: no
    instance can be reported ready while NATS stands still, and the caller waited out its deadline (the stalled-NATS
    fault's last two). It is refused UNAVAILABLE once it has waited --store-wait (1 s here) with the store not
    answering, well within 8 s of the stall (a usual deadline; the call's own is longer, as its wait for CreateSlot
    before the stall is no part of this), its Assign cancelled; repeated once NATS is back, it is served once."""
    metas = {"slow": FunctionMeta(key="slow", runtime="python", memory_in_mb=256, init_duration_in_ms=3000)}
    async with (
        NatsServer(tmp_path / "nats") as nats,
        Stack(nats.url, lease_ttl_s=60, store_wait_s=1.0, metas=metas) as stack,
    ):
        await stack.idle(await stack.assign("warm", key="fa"))
        created = stack.stub.accounting.created

        loop = asyncio.get_running_loop()

        async def call(request_id: str, key: str, deadline_s: float = 8) -> tuple[str, float]:
            """The call's outcome, and when it came (the loop's clock)."""
            meta = pb.Meta(key=key, runtime="python", timeout_in_secs=60, memory_in_mb=256)
            try:
                await stack.scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=deadline_s)
            except grpc.aio.AioRpcError as e:
                return f"{e.code().name}: {e.details()}", loop.time()
            return "OK", loop.time()

        waiting = asyncio.create_task(call("r-slow", "slow", deadline_s=60))
        await eventually(lambda: stack.stub.accounting.created > created, 20)  # stored, its slot made: Init now
        os.kill(nats.proc.pid, signal.SIGSTOP)
        stopped = loop.time()
        try:
            other = asyncio.create_task(call("r-other", "fa"))  # appends nothing NATS answers: the store is away
            async with asyncio.timeout(20):  # NATS stays stopped until both callers have their answer
                (outcome, answered), _ = await asyncio.gather(waiting, other)
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        assert outcome.startswith("UNAVAILABLE") and "while the call waited for an instance" in outcome, outcome
        assert answered - stopped < 8, answered - stopped
        assert (await stack.assign("r-slow", key="slow")).assigment.instance_id  # repeated: served
        await stack.settled()
        async with connected(nats.url, "test") as nc:
            assigned: Counter[str] = Counter()
            await replay.replay(
                nc, seen=lambda _, b: assigned.update(e.request_id for e in b.events if isinstance(e, Assigned))
            )
            assert max(assigned.values()) == 1, assigned
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 0, out.getvalue()
