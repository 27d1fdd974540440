"""The check that a live run decided as the pure core does (tests/decisions.py) can fail."""

import pytest

from scaler.proto.events import Batch, KeptAlive, encode_batch
from scaler.runtime.bus import connected
from tests.decisions import Decisions
from tests.stack import Stack


async def some_decisions(nats_url: str, monkeypatch) -> Decisions:
    decisions = Decisions(monkeypatch)
    async with Stack(nats_url) as stack:
        for r in ("r1", "r2"):
            await stack.idle(await stack.assign(r))
    return decisions


async def test_a_live_run_passes_the_check(nats_url, monkeypatch):
    decisions = await some_decisions(nats_url, monkeypatch)
    await decisions.check(nats_url, "demo")
    assert decisions.features["fn"].arrivals == 2


async def test_decisions_of_another_policy_fail_it(nats_url, monkeypatch):
    decisions = await some_decisions(nats_url, monkeypatch)
    with pytest.raises(
        AssertionError, match=r"\(plan\)"
    ):  # after idle:r1, fixed10 keeps the instance 10 minutes, not 5
        await decisions.check(nats_url, "fixed10")


async def test_a_batch_the_controller_did_not_decide_fails_it(nats_url, monkeypatch):
    decisions = await some_decisions(nats_url, monkeypatch)
    forged = Batch(key="fn", at_ms=1, cause="idle:r2", events=[KeptAlive(at_ms=1, instance_id="fn-1", until_ms=9)])
    async with connected(nats_url, "test") as nc:
        await nc.jetstream().publish("evt.fn", encode_batch(forged))
    with pytest.raises(AssertionError, match=r"is not the controller's decision"):
        await decisions.check(nats_url, "demo")
