"""The challenge's smoke test through gRPC with real timing: every request succeeds, no slot leaks,
and every decision is the pure core's on what the controller saw (however loaded the machine).

How far live figures stay from offline ones is the machine's speed: `python bench/live.py`."""

from pathlib import Path

import pytest

from scaler.simulator.dataset import load_dataset
from scaler.simulator.live import LiveRun
from tests.decisions import Decisions
from tests.stack import Stack

pytestmark = pytest.mark.live_trace

SMOKE = (
    Path(__file__).parents[1] / "fixtures" / "function_smoke_test"
)  # vendored: small, and the same as the shared one


@pytest.fixture(scope="module")
def smoke():
    return load_dataset(SMOKE)


async def test_smoke_test_all_succeed_without_leaks_as_the_core_decides(nats_url, smoke, monkeypatch):
    decisions = Decisions(monkeypatch)
    async with Stack(nats_url, metas=smoke.metas, create_latency_ms=100) as stack:
        driver = LiveRun(smoke, stack.scaler, stack.stub, stack.clock)
        stats = (await driver.run()).stats()
        assert stats.total_requests_count == 980
        assert stats.failed_requests_count == 0, {c.error for c in driver.calls if c.error}
        await stack.settled()
        live = {s.id for s in stack.stub.accounting.live.values()}
        assert live == set(stack.live_instances().values())
        assert stack.stub.accounting.created == stats.total_live_slot_count > 0
    await decisions.check(nats_url, "demo")
    assert sum(f.arrivals for f in decisions.features.values()) == 980
