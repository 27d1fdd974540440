"""The seed systems' rows across nodes, a node's kill -9 and a drain: `scaler node` processes, the workers, a
real nats-server and the stub. A tenant's quota holds over both nodes and after one dies; a state's route,
the limits, policy and version set while running, and a tombstone outlive a kill and a drain; and the only
node refuses to drain unless forced."""

import json

import grpc
import pytest

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.subjects import partition
from tests.gateway.test_admin import scaler
from tests.processes import Parts
from tests.stack import eventually
from tests.system.test_nodes import shared_between
from tests.system.test_seeds import admin_at, assign, until

QUOTA_STATUS = {"scaler-status": "ReachMaxOnDemandInstancesPerTenant"}


def key_in(low: int, high: int, prefix: str) -> str:
    """A metaKey whose partition is in [low, high]: with two nodes, the first holds 0-15, the second 16-31."""
    return next(k for k in (f"{prefix}{n}" for n in range(1000)) if low <= partition(k) <= high)


async def release(scaler_stub: pb_grpc.ScalerStub, reply: pb.AssignReply) -> None:
    await scaler_stub.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)), timeout=30)


def holds(tenant: str, on_demand: int):
    return lambda answer: any(t.tenant == tenant and t.on_demand == on_demand for t in answer.tenants)


async def test_a_tenants_quota_holds_across_two_nodes_and_after_one_is_killed(nats_url, stub, tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"throttle_after_ms": 300, "tenants": {"acme": {"max_on_demand": 2}}}))
    async with Parts(nats_url, f"127.0.0.1:{stub.port}", nodes=2, node_args=("--limits", str(limits))) as parts:
        await shared_between(nats_url, 2)
        on_a, on_b = key_in(0, 15, "a"), key_in(16, 31, "b")
        channel = grpc.aio.insecure_channel(parts.address("node"))
        calls = pb_grpc.ScalerStub(channel)
        first, _ = await assign(calls, "r1", key=on_a, tenant="acme")
        other, _ = await assign(calls, "r2", key=on_b, tenant="acme")  # decided by the other node
        assert first.status == other.status == pb.Ok
        await until(lambda: admin_at(channel, "Tenants"), holds("acme", 2))
        refused, trailing = await assign(calls, "r3", key=on_a, tenant="acme")  # node a's own count is 1
        assert refused.status == pb.Throttle and trailing == QUOTA_STATUS, (refused, trailing)
        assert "tenant acme holds 2 on-demand instance(s), its quota max_on_demand 2" in refused.error_message

        await parts.kill("node-1")
        await shared_between(nats_url, 1)  # node a took the other's partitions, and on_b's instance with them
        refused, trailing = await assign(calls, "r4", key=on_b, tenant="acme")
        assert refused.status == pb.Throttle and trailing == QUOTA_STATUS
        await until(lambda: admin_at(channel, "Tenants"), holds("acme", 2))  # the dead node's count expired
        said = await admin_at(channel, "Quota", tenant="acme", max_on_demand=3)
        assert said.message == "tenant acme: max_on_demand 3, max_reserved 0"
        served, _ = await assign(calls, "r5", key=on_b, tenant="acme")
        assert served.status == pb.Ok
        for reply in (first, other, served):
            await release(calls, reply)
        await channel.close()


async def test_a_state_the_settings_and_a_tombstone_outlive_a_kill_and_a_drain(nats_url, stub):
    async with Parts(nats_url, f"127.0.0.1:{stub.port}", nodes=2) as parts:
        await shared_between(nats_url, 2)
        fn, gone = key_in(16, 31, "f"), key_in(16, 31, "g")  # both on node-1, the one killed then drained
        channel = grpc.aio.insecure_channel(parts.address("node"))
        calls = pb_grpc.ScalerStub(channel)
        first, _ = await assign(calls, "s1", key=fn, state="cart", version="v1")
        holder = first.assigment.instance_id
        await release(calls, first)
        said = await admin_at(channel, "Set", key=fn, max_instances=3, policy="fixed10")
        assert said.message == "limits max_instances 3; policy fixed10"
        await release(calls, (await assign(calls, "g1", key=gone))[0])
        await admin_at(channel, "Delete", key=gone, reason="removed")

        async def kept(n: int) -> None:
            again, _ = await assign(calls, f"s{n}", key=fn, state="cart")
            assert again.assigment.instance_id == holder  # the route, recovered with the state
            await release(calls, again)
            listed = (await admin_at(channel, "List", key=fn)).functions[0]
            assert (listed.states, listed.limits, listed.policy, listed.version) == (
                {"cart": holder},
                {"max_instances": 3},
                "fixed10",
                "v1",
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await assign(calls, f"g{n}", key=gone)
            assert (
                refused.value.code() is grpc.StatusCode.NOT_FOUND and "was deleted: removed" in refused.value.details()
            )

        await parts.kill("node-1")
        await shared_between(nats_url, 1)
        await kept(2)  # node a rebuilt them from the stream

        await parts.start("node-1")
        await shared_between(nats_url, 2)  # node-1 takes partitions 16-31 back (a hand-over: snapshotted)
        code, out, err = await scaler("drain", "--gateway", parts.address("node-1"))
        assert code == 0 and "handed partitions 16-31" in out, err
        await eventually(lambda: parts.running["node-1"].proc.returncode == 0, 30)
        await kept(3)  # node a loaded them from node-1's snapshots
        await channel.close()


async def test_the_only_node_refuses_to_drain_unless_forced(nats_url, stub):
    async with Parts(nats_url, f"127.0.0.1:{stub.port}") as parts:
        where = ("--gateway", parts.address("node"))
        code, out, err = await scaler("drain", *where)
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert err.startswith("scaler drain: FAILED_PRECONDITION: ") and "is the only node" in err
        async with grpc.aio.insecure_channel(parts.address("node")) as channel:
            served, _ = await assign(pb_grpc.ScalerStub(channel), "r1")  # still serving
            assert served.status == pb.Ok
        code, out, err = await scaler("drain", "--force", *where)
        assert code == 0 and "no other node is up" in out, err
        await eventually(lambda: parts.running["node"].proc.returncode == 0, 30)
