from tests.stack import Stack


async def test_cold_start_then_reuse(nats_url):
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        assert first.assigment.instance_id == "fn-1"
        await stack.idle(first)
        second = await stack.assign("r2")
        assert second.assigment.instance_id == "fn-1"
        assert stack.stub.accounting.created == 1
