"""bench/lean_node.py: the node's core in the durable reference's shape decides live as the core does offline."""

import pytest

from bench import live as bench
from scaler.controller.core.policy import get_policy
from scaler.simulator.dataset import load_dataset
from scaler.simulator.offline import simulate
from tests.simulator.test_simulate import meta, request, write_dataset

pytestmark = pytest.mark.live_trace


def calm(folder):
    """Calls seconds apart, so the scaler's own time changes no decision: a1 cold, a2 cold (a1 still busy), a3 on a
    warm instance, b1 cold and failing (its instance destroyed), b2 cold again."""
    return write_dataset(
        folder,
        [meta("a", init=300), meta("b", init=300)],
        [
            request(0, "a", duration=2500),
            request(1000, "a", duration=500),
            request(5000, "a"),
            request(6000, "b", status=500),
            request(8000, "b"),
        ],
    )


@pytest.mark.parametrize("policy", ["demo", "learned"])
async def test_the_lean_node_answers_every_call_with_the_cold_starts_its_policy_makes_offline(tmp_path, policy):
    dataset = load_dataset(calm(tmp_path / "trace"))
    offline = simulate(dataset, get_policy(policy)).stats()
    assert offline.cold_starts == 4  # the trace is what it says: a1, a2, b1, b2

    run, _ = await bench.live(dataset, f"lean node, {policy}")

    live = run.stats()
    assert (live.total_requests_count, live.failed_requests_count) == (5, 0)
    assert live.cold_starts == offline.cold_starts
