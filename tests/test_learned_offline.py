"""Our policy's behaviours over a run, in the offline simulator: what it learns from a function's history."""

import pytest

from controller.core.policy import get_policy
from controller.core.state import Totals
from simulator.dataset import Dataset, FunctionMeta, Request
from simulator.offline import Simulation

LEARNED = get_policy("learned")


def dataset(arrivals: list[int], run_ms: int = 50, memory_mb: int = 512, init_ms: int = 50, key: str = "fn") -> Dataset:
    meta = FunctionMeta(key=key, memory_in_mb=memory_mb, init_duration_in_ms=init_ms)
    return Dataset("t", {key: meta}, [Request(start_time=t, meta_key=key, durations_in_ms=run_ms) for t in arrivals])


def simulate(ds: Dataset, policy=LEARNED) -> Simulation:
    sim = Simulation(ds, policy)
    sim.run()
    return sim


def test_a_periodic_function_is_prewarmed_before_its_next_call():
    period = 30_000
    sim = simulate(dataset([n * period for n in range(40)]))
    run = sim.result(40 * period)
    late = run.invocations[10:]  # once the period is learned
    assert sum(i.cold for i in late) == 0 and max(i.schedule_ms for i in late) == 0
    stats = sim.ledger.states["fn"].stats
    assert stats.prewarms >= 25  # started ahead of the calls...
    # ...and not kept through the gaps: each slot lives about a start plus a run, not 30 s.
    assert run.slot_gb_s < 40 * 0.5 * 1.0


def test_prewarm_is_planned_just_before_the_predicted_arrival():
    period, start = 30_000, 150
    sim = simulate(dataset([n * period for n in range(20)]))
    s = sim.ledger.states["fn"]
    last = s.stats.last_arrival_ms
    plan = LEARNED.prewarm(s, last + 1_000)
    assert plan.count == 0 and plan.next_ms is not None
    assert last + period - 3 * start <= plan.next_ms <= last + period - start


def test_a_large_function_is_kept_for_less_time_than_a_small_one_with_the_same_calls():
    arrivals = [n * 20_000 + (n % 3) * 4_000 for n in range(30)]
    small = simulate(dataset(arrivals, memory_mb=256)).result(arrivals[-1])
    large = simulate(dataset(arrivals, memory_mb=8192)).result(arrivals[-1])
    assert large.slot_gb_s / 32 < small.slot_gb_s  # per GB, the large one keeps less


def test_the_run_totals_equal_the_sum_of_the_functions_stats():
    arrivals = [n * 700 for n in range(200)]
    sim = Simulation(dataset(arrivals, key="a"), LEARNED)
    sim.run()
    again = Totals()
    for s in sim.ledger.states.values():
        again = again.change(None, s)
    assert again == sim.ledger.totals and sim.ledger.totals.exec_ms == pytest.approx(200 * 50)
