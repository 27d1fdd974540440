"""The rules the scaler must hold, each checked end to end: real nats-server, real gRPC, the real stub."""

import argparse
import asyncio

import grpc
import pytest

from scaler import replay
from scaler.controller.__main__ import load_limits
from scaler.controller.core.limits import FunctionLimits, Limits
from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.platform_stub.server import Faults, Refusal
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.commands import Assign
from scaler.proto.events import Assigned, Meta, decode_batch
from scaler.proto.subjects import partition
from scaler.runtime.bus import Unavailable, connected
from scaler.runtime.clock import Clock
from tests.stack import Stack, eventually


def code_of(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


async def test_cold_start_then_warm_reuse(nats_url):
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        assert first.status == pb.Ok and first.assigment.instance_id == "fn-1"
        assert first.assigment.request_id == "r1" and first.assigment.meta_key == "fn"
        await stack.idle(first)
        second = await stack.assign("r2")
        assert second.assigment.instance_id == "fn-1"
        assert stack.stub.accounting.created == 1


async def test_concurrent_assigns_never_share_an_instance(nats_url):
    async with Stack(nats_url) as stack:
        replies = await asyncio.gather(*(stack.assign(f"r{n}") for n in range(20)))
        instances = [r.assigment.instance_id for r in replies]
        assert len(set(instances)) == 20
        # Release half; the next ten reuse exactly those, still one request per instance.
        await asyncio.gather(*(stack.idle(r) for r in replies[:10]))
        again = await asyncio.gather(*(stack.assign(f"s{n}") for n in range(10)))
        reused = [r.assigment.instance_id for r in again]
        assert len(set(reused)) == 10 and set(reused) == set(instances[:10])
        assert stack.stub.accounting.created == 20


async def test_need_destroy_retires_and_destroys_the_slot(nats_url):
    async with Stack(nats_url) as stack:
        reply = await stack.assign("r1")
        await stack.idle(reply, need_destroy=True)
        await stack.settled()
        assert stack.stub.accounting.live == {} and stack.stub.accounting.destroyed == 1
        assert stack.live_instances() == {}
        assert (await stack.assign("r2")).assigment.instance_id == "fn-2"  # a fresh one, not the destroyed


async def test_keep_alive_expiry_destroys_idle_slots(nats_url):
    # Speed 100: the demo's 5-minute keep-alive lasts 3 s of wall time. (Not faster: a start unreported for 30 s
    # of the clock is taken for lost and made again, and at speed 3000 that is 10 ms of a loaded machine's time.)
    async with Stack(nats_url, clock=Clock(100)) as stack:
        reply = await stack.assign("r1")
        await stack.idle(reply)
        await eventually(lambda: not stack.stub.accounting.live)
        await stack.settled()
        assert stack.live_instances() == {} and stack.stub.accounting.destroyed == 1


async def test_every_created_slot_is_in_the_state_or_destroyed(nats_url):
    async with Stack(nats_url) as stack:
        replies = await asyncio.gather(*(stack.assign(f"r{n}", key=f"fn{n % 3}") for n in range(12)))
        await asyncio.gather(*(stack.idle(r, need_destroy=n % 2 == 0) for n, r in enumerate(replies)))
        await stack.settled()
        live = {s.id for s in stack.stub.accounting.live.values()}
        assert live == set(stack.live_instances().values())
        assert stack.stub.accounting.created == 12 and stack.stub.accounting.destroyed == 6


@pytest.mark.parametrize("where", ["create", "init"])
async def test_platform_failure_answers_promptly_and_leaks_nothing(nats_url, where):
    faults = Faults(create=lambda _: "no capacity") if where == "create" else Faults(init=lambda _: "image pull failed")
    async with Stack(nats_url, faults=faults) as stack:
        async with asyncio.timeout(5):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stack.assign("r1")
        assert code_of(e) == grpc.StatusCode.INTERNAL
        assert ("no capacity" if where == "create" else "image pull failed") in e.value.details()
        await stack.settled()
        assert stack.stub.accounting.live == {} and stack.live_instances() == {}
        assert stack.stub.accounting.created == (0 if where == "create" else 1)


@pytest.mark.parametrize(
    "refusal",
    [
        Refusal("too many slots being created", pb.Throttle),
        Refusal("busy", dropped=grpc.StatusCode.UNAVAILABLE),
        Refusal("stream reset", dropped=grpc.StatusCode.CANCELLED),
    ],
    ids=["throttle", "unavailable", "cancelled"],
)
async def test_a_platform_that_throttles_the_first_attempts_still_serves_every_request(nats_url, refusal):
    """Throttle, and a call the platform dropped, mean "not now": the start is tried again, the Assign waits."""
    attempts: dict[str, int] = {}

    def throttle_three_times(request) -> Refusal | None:
        attempts[request.request_id] = attempts.get(request.request_id, 0) + 1
        return refusal if attempts[request.request_id] <= 3 else None

    async with Stack(nats_url, faults=Faults(create=throttle_three_times)) as stack:
        replies = await asyncio.gather(*(stack.assign(f"r{n}", key=f"fn{n % 3}") for n in range(9)))
        assert all(r.status == pb.Ok for r in replies)
        assert len({r.assigment.instance_id for r in replies}) == 9
        assert set(attempts.values()) == {4}, "each start was refused three times, then served"
        assert stack.stub.accounting.created == 9


async def assign_raw(stack: Stack, request: pb.AssignRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stack.scaler.Assign(request, timeout=10)
    return e.value


def meta(key: str = "fn", memory: int = 256) -> pb.Meta:
    return pb.Meta(key=key, runtime="python", memory_in_mb=memory)


@pytest.mark.parametrize(
    "request_, message",
    [
        (pb.AssignRequest(request_id="r1"), "meta_data is missing"),
        (pb.AssignRequest(request_id="", meta_data=meta()), "request_id is empty"),
        (pb.AssignRequest(request_id="r1", meta_data=meta("")), "metaKey is empty"),
        (pb.AssignRequest(request_id="r1", meta_data=meta("k" * 1024)), "longer than 256 bytes"),
        (pb.AssignRequest(request_id="r1", meta_data=meta("a\nb")), "control"),
        (pb.AssignRequest(request_id="r1", meta_data=meta(memory=0)), "memory_in_mb must be positive"),
    ],
    ids=["no meta", "no request id", "empty key", "1 kB key", "control char", "zero memory"],
)
async def test_bad_assign_is_refused_clearly(nats_url, request_, message):
    async with Stack(nats_url) as stack:
        error = await assign_raw(stack, request_)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
        assert stack.stub.accounting.created == 0
        assert (await stack.assign("after")).status == pb.Ok  # and the scaler is still fine


async def test_odd_keys_are_served_on_safe_subjects(nats_url):
    keys = ["a.b", "a*", "a>", "a b", "a%2Eb", ">", "日本"]
    async with Stack(nats_url) as stack:
        replies = await asyncio.gather(*(stack.assign(f"r-{n}", key=k) for n, k in enumerate(keys)))
        assert [r.assigment.meta_key for r in replies] == keys
        await asyncio.gather(*(stack.idle(r) for r in replies))
        again = await asyncio.gather(*(stack.assign(f"s-{n}", key=k) for n, k in enumerate(keys)))
        assert [r.assigment.instance_id for r in again] == [r.assigment.instance_id for r in replies]
        assert stack.stub.accounting.created == len(keys)  # "a.b" and "a%2Eb" did not collide
        assert set(stack.controller.states) == set(keys)


async def test_idle_errors(nats_url):
    async with Stack(nats_url) as stack:
        reply = await stack.assign("r1")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stack.idle(reply, instance_id="no-such-instance")
        assert code_of(e) == grpc.StatusCode.NOT_FOUND and "no-such-instance" in e.value.details()

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stack.idle(reply, meta_key="other-function")
        assert code_of(e) == grpc.StatusCode.NOT_FOUND and "other-function" in e.value.details()

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stack.scaler.Idle(pb.IdleRequest(), timeout=10)
        assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT and "assigment is missing" in e.value.details()

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stack.idle(reply, request_id="someone-else")
        assert code_of(e) == grpc.StatusCode.FAILED_PRECONDITION

        assert (await stack.idle(reply)).status == pb.Ok
        assert (await stack.idle(reply)).status == pb.Ok  # twice: a retry, answered without a second release
        await stack.settled()  # both answered at once, the release stored behind them
        state = stack.controller.states["fn"]
        assert [i.phase.value for i in state.instances.values()] == ["idle"]
        second = await stack.assign("r2")
        assert second.assigment.instance_id == reply.assigment.instance_id
        # fn-1 now serves r2: r1's Idle, repeated, says its release was recorded and does not free fn-1
        assert (await stack.idle(reply)).status == pb.Ok
        assert stack.controller.states["fn"].instances["fn-1"].request_id == "r2"
        assert stack.controller.states["fn"].instances["fn-1"].phase.value == "busy"


async def test_a_retried_assign_is_not_a_second_command(nats_url):
    async with Stack(nats_url) as stack:
        first, retry = await asyncio.gather(stack.assign("r1"), stack.assign("r1"))
        assert first.assigment.instance_id == retry.assigment.instance_id == "fn-1"
        again = await stack.assign("r1")  # after the answer too
        assert again.assigment.instance_id == "fn-1"
        assert stack.stub.accounting.created == 1
        assert stack.controller.ledger.features_of("fn").arrivals == 1


async def test_a_node_that_believes_it_serves_a_partition_it_holds_no_lease_for_decides_nothing(nats_url):
    """Fenced: a node that takes a partition as one whose lease lapsed unnoticed would decides nothing for it (its
    lease is not fresh); the call goes to the owner, on the state the stream holds. Beneath the fence, the order
    check stops a stale writer's append all the same (tests/controller/path/test_writer.py)."""
    async with Stack(nats_url) as stack:
        stale = Controller(nats_url, get_policy("demo"))
        await stale.start()  # every partition is leased to the stack's controller: it serves none
        stale.serving.add(partition("fn"))  # ... but takes one as a node whose lease lapsed unnoticed would
        try:
            first = await stack.assign("r1")
            await stack.idle(first)  # fn-1 idle, which the stale controller has not seen
            meta = Meta(memory_mb=256, runtime="python", timeout_s=60)
            reply = await stale.call(Assign(key="fn", request_id="r2", meta=meta), 30)
            assert reply.instance_id == "fn-1", "the owner reuses the idle instance"
            assert stack.stub.accounting.created == 1, "no second slot from a decision on a stale state"
            assert "fn" not in stale.states, "the stale node folded or decided something of fn"
            async with connected(nats_url, "test") as nc:
                replayed = await replay.replay(nc)
            assert replayed.states["fn"] == stack.controller.states["fn"]
            assert replayed.states["fn"].instances["fn-1"].request_id == "r2"
        finally:
            await stale.stop()


async def test_past_a_cap_an_assign_waits_then_is_answered_throttle(nats_url):
    limits = Limits(functions={"fn": FunctionLimits(max_instances=1)}, throttle_after_ms=300)
    async with Stack(nats_url, limits=limits) as stack:
        first = await stack.assign("r1")
        held_back = await stack.assign("r2")  # fn-1 is busy, and fn may have no second instance
        assert held_back.status == pb.Throttle and "at the cap (max_instances 1)" in held_back.error_message
        await stack.idle(first)
        assert (await stack.assign("r3")).assigment.instance_id == "fn-1"
        assert stack.stub.accounting.created == 1


def test_a_limits_file_is_read_and_a_bad_one_refused_with_its_name(tmp_path):
    good = tmp_path / "limits.json"
    good.write_text('{"default": {"max_instances": 50}, "functions": {"f": {"min_warm": 2}}, "max_memory_mb": 65536}')
    limits = load_limits(str(good))
    assert (limits.of("f").min_warm, limits.of("g").max_instances, limits.max_memory_mb) == (2, 50, 65536)
    bad = tmp_path / "bad.json"
    bad.write_text('{"default": {"max_instance": 5}}')
    with pytest.raises(argparse.ArgumentTypeError, match=r"bad\.json: .*max_instance"):
        load_limits(str(bad))


async def test_an_idle_for_an_instance_the_state_has_not_seen_reads_the_stream_before_it_is_not_found(nats_url):
    """A node whose state of a function is behind the stream (a load from a server still applying what it
    stored) would answer an Idle NOT_FOUND without an append, where no order check stops it: it reads first."""
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        assert first.assigment.instance_id == "fn-1"
        stack.controller.ledger.forget("fn")  # its state of fn is behind the stream: it has not seen fn-1
        assert (await stack.idle(first)).status == pb.Ok
        await stack.settled()  # the release is answered at once, and stored right behind
        assert stack.controller.states["fn"].instances["fn-1"].phase.value == "idle"
        with pytest.raises(grpc.aio.AioRpcError) as e:  # an instance the stream has not seen either
            await stack.idle(first, request_id="r9", instance_id="fn-7")
        assert code_of(e) == grpc.StatusCode.NOT_FOUND


async def test_an_assignment_stored_though_its_ack_was_lost_is_still_answered(nats_url):
    """The batch that hands a waiting request its instance is stored, but its ack is lost (NATS stood still):
    the append is tried again and conflicts with itself, the catch-up folds it, and deciding the report again
    is a no-op. The waiting caller must still be told its instance, not left to time out."""
    async with Stack(nats_url, create_latency_ms=200) as stack:
        commits = stack.controller.writer.store.commits
        store, lost = commits.store, []

        async def ack_lost_once(a):
            seq = await store(a)
            if not lost and any(isinstance(e, Assigned) for e in decode_batch(a.data).events):
                lost.append(seq)
                raise Unavailable("the ack was lost")
            return seq

        commits.store = ack_lost_once
        async with asyncio.timeout(20):
            reply = await stack.assign("r1")  # waits for a cold start; its Assigned is the batch whose ack is lost
        assert lost, "the fault was not met"
        assert reply.status == pb.Ok and reply.assigment.instance_id == "fn-1"
        await stack.idle(reply)
