import pytest

from scaler.platform_stub.server import PlatformStub
from scaler.runtime.natsd import NatsServer


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server with JetStream, fresh for each test, its store in the test's temp dir."""
    async with NatsServer(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
async def stub():
    """The platform stub, as the scaler's own tests use it (a slot per CreateSlot, 20 ms to make one)."""
    platform = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await platform.start()
    yield platform
    await platform.stop()


@pytest.fixture
async def challenge_stub():
    """The platform stub as the challenge's platform behaves: a new slot per CreateSlot, no list of its slots."""
    platform = PlatformStub("127.0.0.1:0", create_latency_ms=20, like_challenge=True)
    await platform.start()
    yield platform
    await platform.stop()
