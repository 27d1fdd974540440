import pytest

from runtime.natsd import NatsServer


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server with JetStream, fresh for each test, its store in the test's temp dir."""
    async with NatsServer(tmp_path / "nats") as server:
        yield server.url
