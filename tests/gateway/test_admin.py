"""Function admin on real processes: restart and delete against a platform that makes a new slot per
CreateSlot and cannot list its slots (no reconcile could find a slot left behind)."""

import asyncio
import sys

import grpc
import msgspec
import pytest

from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.gateway.admin import SERVICE, Answer
from scaler.gateway.server import Gateway
from scaler.proto import events as e
from tests.stack import Stack, eventually
from tests.system.test_nodes import KEYS, shared_between
from tests.system.test_sessions import stored_events


async def admin(stack: Stack, method: str, **body) -> Answer:
    call = stack.channel.unary_unary(f"/{SERVICE}/{method}")
    return msgspec.json.decode(await call(msgspec.json.encode(body), timeout=30), type=Answer)


async def scaler(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


def live_slots(stack: Stack) -> int:
    return len(stack.stub.accounting.live)


async def test_restart_and_delete_leave_no_slot_behind(nats_url):
    async with Stack(nats_url, like_challenge=True, create_latency_ms=500) as stack:
        a, b, c = await asyncio.gather(stack.assign("a"), stack.assign("b"), stack.assign("c"))
        await asyncio.gather(stack.idle(a), stack.idle(b))  # two idle, c busy
        await stack.settled()  # their releases stored
        busy = c.assigment.instance_id
        idle = sorted({"fn-1", "fn-2", "fn-3"} - {busy})
        listed = (await admin(stack, "List")).functions
        assert [(f.key, f.instances) for f in listed] == [("fn", {"idle": idle, "busy": [busy]})]

        said = await admin(stack, "Restart", key="fn", reason="new code")
        assert said.message == "2 idle instance(s) retired, 1 busy one(s) retire when released"
        await eventually(lambda: live_slots(stack) == 1)  # the idle ones' slots destroyed at once
        fresh = await stack.assign("d")  # a new instance: none of the old ones serves again
        assert fresh.assigment.instance_id == "fn-4"
        await stack.idle(c)
        await eventually(lambda: live_slots(stack) == 1)  # c's slot went when it was released

        # Delete while d is busy and e's instance is still being created (its slot does not exist yet).
        pending = asyncio.create_task(stack.assign("e"))
        await eventually(
            lambda: any(i.phase.value == "creating" for i in stack.controller.states["fn"].instances.values())
        )
        said = await admin(stack, "Delete", key="fn", reason="retired app")
        assert said.message == "2 instance(s) retired; its calls are refused until it is created again"
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pending
        assert (
            failed.value.code() is grpc.StatusCode.NOT_FOUND
            and "function deleted: retired app" in failed.value.details()
        )
        await eventually(lambda: live_slots(stack) == 0 and not stack.controller.states["fn"].instances)
        assert stack.stub.accounting.created == 5  # e's slot was made after the delete, and destroyed

        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a tombstone: refused until created again
            await stack.assign("f")
        assert (
            refused.value.code() is grpc.StatusCode.NOT_FOUND and "was deleted: retired app" in refused.value.details()
        )
        said = await admin(stack, "Create", key="fn", reason="back again")
        assert said.message == "created again: its calls are served"
        again = await stack.assign("f")  # starts afresh
        assert stack.controller.ledger.features_of("fn").arrivals == 1
        await stack.idle(again)
        where = ("--gateway", f"127.0.0.1:{stack.gateway.port}")
        code, out, _ = await scaler("functions", *where)
        assert code == 0 and out == f"fn  256 MB: 1 idle ({again.assigment.instance_id})\n"
        code, out, err = await scaler("delete", "fn", "--reason", "gone for good", *where)
        assert code == 0 and out == "fn: 1 instance(s) retired; its calls are refused until it is created again\n", err
        await eventually(lambda: live_slots(stack) == 0 and not stack.controller.states["fn"].instances)
        code, _, err = await scaler("restart", "fn", *where)
        assert code == 1 and err.startswith("scaler restart: NOT_FOUND: function 'fn' was deleted: gone for good;")
        assert err.count("\n") == 1

        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await admin(stack, "Delete", key="")
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    kinds = [type(x) for batch in await stored_events(nats_url) for x in batch]
    assert kinds.count(e.FunctionRestarted) == 1 and kinds.count(e.FunctionDeleted) == 2


async def test_admin_calls_reach_the_node_that_owns_the_function(nats_url):
    """Through either node: a restart is decided by the function's owner, a list shows every node's functions."""
    async with Stack(nats_url) as stack:
        b = Controller(nats_url, get_policy("demo"))
        gateway = Gateway(b, "127.0.0.1:0", reply_timeout_s=30)
        await b.start()
        await gateway.start()
        try:
            await shared_between(nats_url, 2)
            for key in KEYS:
                await stack.idle(await stack.assign(f"r-{key}", key=key))
            owners = {key: "a" if stack.controller.serves(key) else "b" for key in KEYS}
            assert set(owners.values()) == {"a", "b"}
            through_b = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}")
            listed = await through_b.unary_unary(f"/{SERVICE}/List")(b"{}", timeout=30)
            assert [f.key for f in msgspec.json.decode(listed, type=Answer).functions] == sorted(KEYS)
            restart = through_b.unary_unary(f"/{SERVICE}/Restart")
            for key in KEYS:
                said = msgspec.json.decode(await restart(msgspec.json.encode({"key": key}), timeout=30), type=Answer)
                assert said.message == "1 idle instance(s) retired, 0 busy one(s) retire when released"
            await through_b.close()
            await eventually(lambda: not stack.stub.accounting.live)
        finally:
            await gateway.stop()
            await b.stop()
    kinds = [type(x) for key in KEYS for batch in await stored_events(nats_url, key) for x in batch]
    assert kinds.count(e.FunctionRestarted) == len(KEYS)
