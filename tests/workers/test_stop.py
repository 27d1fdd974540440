"""A worker stops, even when a cancellation is swallowed on the way: Python 3.11's wait_for (under every nats-py
request) returns the answer instead of raising when the cancel lands just as that answer does, and a loop around
such a request goes on. The consumer watch's loop did, and a test suite's Stack waited for its worker forever."""

import asyncio

import pytest

from scaler.platform_stub.server import PlatformStub
from scaler.workers import effects
from scaler.workers.gc import GcWorker
from scaler.workers.platform import PlatformWorker


@pytest.mark.parametrize("kind", [PlatformWorker, GcWorker])
async def test_a_worker_stops_though_its_consumer_watch_swallowed_a_cancellation(nats_url, monkeypatch, kind):
    monkeypatch.setattr(effects, "WATCH_S", 0.01)
    stub = PlatformStub("127.0.0.1:0")
    await stub.start()
    worker = kind(nats_url, f"127.0.0.1:{stub.port}")
    try:
        await worker.start()
        asking, swallowed = asyncio.Event(), []

        async def answered_as_the_cancel_lands(*args, **kwargs):
            asking.set()
            try:
                await asyncio.Event().wait()  # the answer, on its way
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # as wait_for does: the answer returned, the cancel gone

        worker._js.consumer_info = answered_as_the_cancel_lands
        await asking.wait()
        async with asyncio.timeout(10):
            await worker.stop()
        assert swallowed, "the cancel did land inside the request"
    finally:
        await stub.stop()
