"""A late retry is known for what it is as long as the platform may send it: across rests, many releases and
restarts, the same request id never gets a second instance."""

import grpc
import pytest

from scaler.controller.core.limits import Limits
from tests.stack import Stack, eventually


async def assert_known(stack: Stack, request_id: str, instance: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.assign(request_id)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == f"request {request_id} already finished on instance {instance}"


async def test_a_retry_after_a_rest_and_300_releases_and_a_restart_gets_no_second_instance(nats_url):
    rests_soon = Limits(rest_after_ms=200)
    async with Stack(nats_url, limits=rests_soon) as stack:
        first = await stack.assign("r1")
        await stack.idle(first, need_destroy=True)
        await eventually(lambda: stack.controller.states["fn"].rested)
        await assert_known(stack, "r1", first.assigment.instance_id)
        for n in range(300):  # more releases than the 256 once remembered
            await stack.idle(await stack.assign(f"x{n}"))
        await assert_known(stack, "r1", first.assigment.instance_id)
    async with Stack(nats_url, limits=rests_soon) as restarted:  # from the snapshots the stop wrote
        assert restarted.controller.loaded_batches == 0
        await assert_known(restarted, "r1", first.assigment.instance_id)
