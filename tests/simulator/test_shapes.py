"""The generated traces: deterministic, in the challenge's format, with the shapes they promise."""

from collections import defaultdict

import pytest

from scaler.controller.core.policy import POLICIES, get_policy
from scaler.simulator import shapes
from scaler.simulator.dataset import load_dataset
from scaler.simulator.offline import simulate


def starts_by_key(trace: str, seed: int = 0) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for r in shapes.generate(trace, seed).requests:
        out[r.meta_key].append(r.start_time - shapes.EPOCH_MS)
    return out


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    assert shapes.generate("mixed", 7) == shapes.generate("mixed", 7)
    assert shapes.generate("mixed", 7).requests != shapes.generate("mixed", 8).requests


def test_a_written_trace_reads_back_as_generated(tmp_path):
    dataset = shapes.generate("burst", 3)
    folder = shapes.write(dataset, tmp_path / dataset.name)
    assert load_dataset(folder) == dataset


@pytest.mark.parametrize("trace", shapes.TRACES)
def test_every_trace_stays_in_the_ranges_real_functions_have(trace):
    dataset = shapes.generate(trace)
    assert {m.memory_in_mb for m in dataset.metas.values()} <= set(shapes.MEMORY_MB)
    assert all(30 <= m.init_duration_in_ms <= 12_000 for m in dataset.metas.values())
    assert all(5 <= r.durations_in_ms <= 20_000 for r in dataset.requests)
    assert all(0 <= r.start_time - shapes.EPOCH_MS < shapes.SPAN_MS for r in dataset.requests)
    assert [r.start_time for r in dataset.requests] == sorted(r.start_time for r in dataset.requests)
    assert {r.meta_key for r in dataset.requests} <= dataset.metas.keys()
    assert len(dataset.requests) < 25_000  # seconds to simulate offline


def test_a_pure_trace_has_one_shape_and_the_mixed_one_all():
    for shape in shapes.SHAPES:
        assert {key.split("-")[0] for key in shapes.generate(shape).metas} == {shape}
    assert {key.split("-")[0] for key in shapes.generate("mixed").metas} == set(shapes.SHAPES)


@pytest.mark.parametrize("trace", ["timer", "mixed"])
def test_the_named_timers_tick_as_promised(trace):
    starts, metas = starts_by_key(trace), shapes.generate(trace).metas
    assert metas["timer-60s-init11s"].init_duration_in_ms == 11_000
    gaps = [b - a for a, b in zip(starts["timer-60s-init11s"], starts["timer-60s-init11s"][1:], strict=False)]
    assert len(gaps) >= 58 and all(59_000 <= g <= 61_000 for g in gaps)
    gaps = [b - a for a, b in zip(starts["timer-30s-3ms"], starts["timer-30s-3ms"][1:], strict=False)]
    assert len(gaps) >= 118 and all(30_000 - 6 <= g <= 30_000 + 6 for g in gaps)
    assert len(set(gaps)) > 3  # jittered, not exact


def test_bursts_are_tens_of_calls_within_seconds_then_minutes_of_nothing():
    for key, starts in starts_by_key("burst").items():
        bursts, current = [], [starts[0]]
        for t in starts[1:]:
            if t - current[-1] > 60_000:
                bursts.append(current)
                current = []
            current.append(t)
        bursts.append(current)
        assert len(bursts) >= 3, key
        assert all(b[-1] - b[0] <= 8_000 for b in bursts), key
        assert all(len(b) >= 30 for b in bursts[:-1]), key  # the last may be cut by the trace's end


def test_poisson_rates_span_from_minutes_apart_to_several_a_second():
    counts = sorted(len(s) for s in starts_by_key("poisson").values())
    assert counts[0] <= 15 and counts[-1] >= 7_000


def test_ramps_rise_and_fall():
    for key, starts in starts_by_key("ramp").items():
        per_5_min = [0] * 12
        for t in starts:
            per_5_min[t // 300_000] += 1
        top = max(per_5_min)
        assert top >= 30 and 0 < per_5_min.index(top) < 11, (key, per_5_min)
        assert per_5_min[0] <= top / 2 and per_5_min[-1] <= top / 2, (key, per_5_min)


def test_oneoffs_are_called_at_most_three_times():
    assert all(1 <= len(s) <= 3 for s in starts_by_key("oneoff").values())


@pytest.mark.parametrize("policy", list(POLICIES))
def test_no_policy_executes_more_than_it_holds_slots_for(policy):
    # Every execution runs on a slot held for it alone, so executions' GB·s can never exceed the
    # slots' (a resource score above 50): on 20 minutes of every shape, whatever the policy does.
    stats = simulate(shapes.generate("mixed", seed=1, span_ms=20 * 60_000), get_policy(policy)).stats()
    assert stats.failed_requests_count == 0
    assert 0 < stats.invocation_execution_time_in_g_bs <= stats.total_slot_time_in_g_bs
    assert stats.resource_usage_score <= 50
