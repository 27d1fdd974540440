"""The papers' metrics beside the score, on a trace small enough to work out by hand."""

import json

import pytest

from scaler.controller.core.policy import get_policy
from scaler.simulator.dataset import load_dataset
from scaler.simulator.offline import simulate
from scaler.simulator.score import RUN_TAIL_MS, percentile
from tests.simulator.test_simulate import meta, request, simulate_cli, write_dataset

# One function of 1 GB whose start takes 100 ms (CreateSlot) + 900 ms (Init), under `demo`'s 5-minute
# keep-alive: requests at 0 s (cold), 5 s and 6 s (warm), 400 s (its instance went at 306.1 s: cold again).
START_MS = 100 + 900
RUNS = [(0, 100), (5_000, 100), (6_000, 100), (400_000, 100)]


def by_hand_trace(folder):
    return write_dataset(folder, [meta("f", memory=1024, init=900)], [request(t, "f", d) for t, d in RUNS])


@pytest.fixture
def by_hand(tmp_path):
    return by_hand_trace(tmp_path / "by-hand")


def test_cold_start_rate_wasted_memory_and_waits_as_worked_out(by_hand):
    stats = simulate(load_dataset(by_hand), get_policy("demo")).stats()
    assert stats.cold_starts == 2
    assert stats.cold_start_rate == 2 / 4
    # The first instance lives from 0 to 300 s after its last release (6.1 s); the second from 400 s to
    # the end of the run, RUN_TAIL_MS after the last Idle (400 s + its 1 s start + 0.1 s).
    first = 6_000 + 100 + 300_000
    second = 400_000 + START_MS + 100 + RUN_TAIL_MS - 400_000
    slot_gb_s = (first + second) / 1000
    assert stats.total_slot_time_in_g_bs == pytest.approx(slot_gb_s)
    assert stats.wasted_memory_time_in_g_bs == pytest.approx(slot_gb_s - 4 * 0.1)
    assert (stats.wait_p50_in_ms, stats.wait_p99_in_ms, stats.wait_max_in_ms) == (0, START_MS, START_MS)


def test_a_longer_keep_alive_trades_wasted_memory_for_cold_starts(by_hand):
    """fixed10 keeps the instance over the 394 s gap: one cold start, and the gap paid for in idle memory."""
    stats = simulate(load_dataset(by_hand), get_policy("fixed10")).stats()
    assert stats.cold_start_rate == 1 / 4
    assert (stats.wait_p50_in_ms, stats.wait_p99_in_ms) == (0, START_MS)
    assert stats.wasted_memory_time_in_g_bs == pytest.approx((400_000 + 100 + RUN_TAIL_MS) / 1000 - 4 * 0.1)


def test_the_metrics_are_printed_and_written(by_hand, tmp_path, capsys):
    out_json = tmp_path / "stats.json"
    code, out, _ = simulate_cli(capsys, by_hand, "--offline", "--policy", "demo", "--json", out_json)
    assert code == 0
    stats = json.loads(out_json.read_text())
    assert stats["coldStartRate"] == 0.5
    assert (stats["waitP50InMs"], stats["waitP99InMs"], stats["waitMaxInMs"]) == (0, START_MS, START_MS)
    assert stats["functions"][0]["waitP99Ms"] == START_MS
    assert "\n  coldStartRate " in out and "50.00%" in out
    assert "\n  wastedMemoryTimeInGBs " in out


@pytest.mark.parametrize(
    "values, q, expected",
    [([], 50, 0.0), ([7], 99, 7), ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 99, 4), (list(range(1, 101)), 99, 99)],
)
def test_percentiles_are_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected
