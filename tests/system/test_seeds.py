"""The seed systems' rows on real processes: a real nats-server, the node's gRPC services (Scaler and Admin),
the platform stub, and two nodes where ownership matters; across a node's kill and a drain in
tests/system/test_seeds_nodes.py."""

import asyncio

import grpc
import msgspec
import pytest

from scaler.controller.core.limits import FunctionLimits, Limits
from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.gateway.admin import SERVICE, Answer
from scaler.gateway.server import Gateway
from scaler.proto import events as e
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.subjects import partition
from tests.gateway.test_admin import scaler
from tests.replay.test_replay import scaler_replay
from tests.stack import Stack, eventually
from tests.system.test_nodes import shared_between
from tests.system.test_sessions import stored_events

THROTTLE_MS = 300


async def admin_at(channel: grpc.aio.Channel, method: str, **body) -> Answer:
    call = channel.unary_unary(f"/{SERVICE}/{method}")
    return msgspec.json.decode(await call(msgspec.json.encode(body), timeout=30), type=Answer)


async def assign(
    scaler_stub: pb_grpc.ScalerStub, r: str, key: str = "fn", runtime: str = "python", **named: str
) -> tuple[pb.AssignReply, dict[str, str]]:
    """An Assign naming what `named` says in its metadata (state, tenant, version): its reply and trailing metadata."""
    meta = pb.Meta(key=key, runtime=runtime, timeout_in_secs=60, memory_in_mb=256)
    metadata = tuple((f"scaler-{k}", v) for k, v in named.items()) or None
    call = scaler_stub.Assign(pb.AssignRequest(request_id=r, meta_data=meta), timeout=30, metadata=metadata)
    reply = await call
    return reply, dict(await call.trailing_metadata() or ())


async def idle(stack: Stack, reply: pb.AssignReply, **kw) -> None:
    await stack.idle(reply, **kw)


def slots(stack: Stack) -> int:
    return len(stack.stub.accounting.live)


async def test_a_state_keeps_its_instance_across_requests_until_deleted(nats_url):
    async with Stack(nats_url) as stack:
        first, _ = await assign(stack.scaler, "s1", state="cart-7")
        holder = first.assigment.instance_id
        waiting = asyncio.create_task(assign(stack.scaler, "s2", state="cart-7"))  # its instance is busy: it waits
        await eventually(lambda: stack.controller.states["fn"].pending("s2") is not None)
        plain, _ = await assign(stack.scaler, "p1")  # without the state: never the state's instance
        assert plain.assigment.instance_id != holder
        await idle(stack, first)
        second, _ = await waiting
        assert second.assigment.instance_id == holder and stack.stub.accounting.created == 2
        await asyncio.gather(idle(stack, second), idle(stack, plain))

        listed = (await admin_at(stack.channel, "List", key="fn")).functions[0]
        assert listed.states == {"cart-7": holder}
        said = await admin_at(stack.channel, "DeleteState", key="fn", state="cart-7", reason="checked out")
        assert said.message == f"state cart-7 deleted; {holder} retired"
        await eventually(lambda: slots(stack) == 1)  # its slot destroyed: the state's data went with it
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await admin_at(stack.channel, "DeleteState", key="fn", state="cart-7")
        assert gone.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as both:
            await assign(stack.scaler, "x", state="a", session="b")
        assert both.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn")
    assert code == 0, err
    assert f"state cart-7 bound to {holder} by s1 (the state's first request)" in out
    assert "state cart-7 deleted by an operator (checked out)" in out


async def test_limits_set_while_running_retire_past_a_lowered_max_and_refuse_starts_beyond(nats_url):
    async with Stack(nats_url, limits=Limits(throttle_after_ms=THROTTLE_MS)) as stack:
        replies = await asyncio.gather(*(assign(stack.scaler, r) for r in ("a", "b", "c")))
        await asyncio.gather(*(idle(stack, reply) for reply, _ in replies[:2]))  # two idle, c busy
        said = await admin_at(stack.channel, "Set", key="fn", max_instances=1, reason="budget")
        assert said.message == "limits max_instances 1; 2 idle instance(s) past them retired"
        await eventually(lambda: slots(stack) == 1)
        refused, _ = await assign(stack.scaler, "d")  # c still busy: at the max, nothing starts
        assert refused.status == pb.Throttle and "max_instances 1" in refused.error_message
        assert stack.stub.accounting.created == 3
        code, out, err = await scaler("set", "fn", "--reset-limits", "--gateway", f"127.0.0.1:{stack.gateway.port}")
        assert code == 0 and out == "fn: limits none\n", err
        served, _ = await assign(stack.scaler, "e")  # the limits file's (none) again
        assert served.status == pb.Ok
        await asyncio.gather(idle(stack, served), idle(stack, replies[2][0]))
    code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn")
    assert code == 0 and "limits set while running: max_instances 1 (budget)" in out, err


async def test_a_new_version_retires_the_old_instances_when_idle_and_a_delete_leaves_a_tombstone(nats_url):
    async with Stack(nats_url) as stack:
        old_idle, _ = await assign(stack.scaler, "a", version="v1")
        old_busy, _ = await assign(stack.scaler, "b", version="v1")
        await idle(stack, old_idle)
        fresh, _ = await assign(stack.scaler, "c", version="v2")
        assert fresh.assigment.instance_id not in {old_idle.assigment.instance_id, old_busy.assigment.instance_id}
        await eventually(lambda: slots(stack) == 2)  # the idle v1 one went; the busy one runs on
        await idle(stack, old_busy)  # never mid-request: it goes once released
        await eventually(lambda: slots(stack) == 1)
        await idle(stack, fresh)
        moved, _ = await assign(stack.scaler, "d", runtime="python3.12")  # a new runtime is a new version too
        assert moved.assigment.instance_id != fresh.assigment.instance_id
        await idle(stack, moved)

        await admin_at(stack.channel, "Delete", key="fn", reason="app removed")
        await eventually(lambda: slots(stack) == 0)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await assign(stack.scaler, "e", runtime="python3.12", version="v2")
        assert (
            refused.value.code() is grpc.StatusCode.NOT_FOUND and "was deleted: app removed" in refused.value.details()
        )
        back, _ = await assign(stack.scaler, "f", runtime="python3.12", version="v3")  # a new version creates it
        assert back.status == pb.Ok
        await idle(stack, back)
    kinds = [type(x) for batch in await stored_events(nats_url) for x in batch]
    assert kinds.count(e.VersionSet) == 2 and kinds.count(e.FunctionCreated) == 1


async def test_a_function_is_decided_by_its_own_policy_set_live(nats_url):
    limits = Limits(functions={"fn": FunctionLimits(policy="fixed10")})
    async with Stack(nats_url, limits=limits) as stack:  # the node's policy is demo (300 s)
        reply, _ = await assign(stack.scaler, "a")
        await idle(stack, reply)
        await stack.settled()  # the keep-alive is planned after the Idle's answer: by fixed10, before the Set
        await admin_at(stack.channel, "Set", key="fn", policy="demo", reason="cheaper")
        reply, _ = await assign(stack.scaler, "b")
        await idle(stack, reply)
        await stack.settled()
    kept = [x.why for batch in await stored_events(nats_url) for x in batch if isinstance(x, e.KeptAlive)]
    assert kept == ["fixed keep-alive 600s", "fixed keep-alive 300s"]


async def test_an_exchange_rate_set_live_is_stored_shown_and_a_bad_one_refused(nats_url):
    async with Stack(nats_url) as stack:
        reply, _ = await assign(stack.scaler, "a")
        await idle(stack, reply)
        gateway = ("--gateway", f"127.0.0.1:{stack.gateway.port}")
        code, out, err = await scaler("set", "fn", "--policy", "learned", "--exchange-rate", "1000", *gateway)
        assert code == 0 and out == "fn: limits exchange_rate 1000; policy learned\n", err
        code, out, err = await scaler("functions", *gateway)
        assert code == 0 and "policy learned; exchange_rate 1000" in out, (out, err)
        code, out, err = await scaler("set", "fn", "--exchange-rate", "0", *gateway)
        assert code != 0 and "an exchange rate is 0.1 to 1,000,000" in err, (out, err)
    rates = [x.exchange_rate for batch in await stored_events(nats_url) for x in batch if isinstance(x, e.LimitsSet)]
    assert rates == [1000.0]
    code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn")
    assert code == 0 and "limits set while running: exchange_rate 1000" in out, err


async def test_a_policy_the_owner_cannot_load_is_refused_at_its_door(nats_url):
    async with Stack(nats_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin_at(stack.channel, "Set", key="fn", policy="no_such_module:Policy")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no module named 'no_such_module'" in refused.value.details()
    assert not [x for batch in await stored_events(nats_url) for x in batch if isinstance(x, e.PolicySet)]


async def test_one_instance_restarted_stopped_and_its_stats(nats_url):
    async with Stack(nats_url) as stack:
        a, _ = await assign(stack.scaler, "a")
        b, _ = await assign(stack.scaler, "b")
        await idle(stack, a)
        await stack.settled()  # an Idle is answered before its release is stored, and the stats are what is stored
        ia, ib = a.assigment.instance_id, b.assigment.instance_id
        stats = {i.id: i for i in (await admin_at(stack.channel, "Instances", key="fn")).instances}
        assert (stats[ia].phase, stats[ia].served, stats[ib].phase, stats[ib].request) == ("idle", 1, "busy", "b")
        said = await admin_at(stack.channel, "Restart", key="fn", instance=ia, reason="leak")
        assert said.message == f"{ia} retired; fn-3 starts in its place"
        said = await admin_at(stack.channel, "Stop", key="fn", instance=ib)
        assert said.message == f"{ib} retires when released"
        await idle(stack, b)
        await eventually(lambda: set(stack.live_instances()) == {"fn-3"} and slots(stack) == 1)
        where = ("--gateway", f"127.0.0.1:{stack.gateway.port}")
        code, out, err = await scaler("instances", "fn", *where)
        assert code == 0 and out.startswith("fn-3  idle since ") and "served 0 (0 error(s))" in out, err


async def test_admin_of_one_function_goes_to_its_owner_and_nodes_lists_both(nats_url):
    """Through node b: the stats of a function node a owns, and the nodes with their partitions."""
    async with Stack(nats_url) as stack:
        b = Controller(nats_url, get_policy("demo"))
        gateway = Gateway(b, "127.0.0.1:0", reply_timeout_s=30)
        await b.start()
        await gateway.start()
        stack.controller.address, b.address = f"127.0.0.1:{stack.gateway.port}", f"127.0.0.1:{gateway.port}"
        try:
            await shared_between(nats_url, 2)
            key = next(k for k in (f"k{n}" for n in range(64)) if stack.controller.serves(k))
            reply, _ = await assign(stack.scaler, "r", key=key)
            through_b = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
            stats = (await admin_at(through_b, "Instances", key=key)).instances
            assert [(i.id, i.phase, i.request) for i in stats] == [(reply.assigment.instance_id, "busy", "r")]
            said = await admin_at(through_b, "Stop", key=key, instance=reply.assigment.instance_id)
            assert said.message == f"{reply.assigment.instance_id} retires when released"  # decided by node a
            await stack.idle(reply)
            await eventually(lambda: not stack.controller.states[key].instances)

            def both(answer: Answer) -> bool:
                return len(answer.nodes) == 2 and all(m.get("address") for m in answer.nodes)

            nodes = (await until(lambda: admin_at(through_b, "Nodes"), both)).nodes
            mine = next(m for m in nodes if m["address"] == stack.controller.address)
            assert sorted(len(m["partitions"]) for m in nodes) == [16, 16] and partition(key) in mine["partitions"]
            assert mine["node"] == stack.controller.node and mine["heartbeat_s"] < 5 > max(mine["lease_ages_s"])
            code, out, err = await scaler("nodes", "--gateway", b.address)
            assert code == 0 and len(out.splitlines()) == 2 and "partitions 0-15 (16)" in out, err
            await through_b.close()
        finally:
            await gateway.stop()
            await b.stop()


async def until(ask, ok, seconds: float = 10.0):
    """`await ask()`, again until `ok` of it holds."""
    async with asyncio.timeout(seconds):
        while True:
            if ok(got := await ask()):
                return got
            await asyncio.sleep(0.1)
