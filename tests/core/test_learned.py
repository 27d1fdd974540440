"""Our policy's behaviours that matter, pinned on the pure core."""

import pytest
from msgspec.structs import replace

from controller.core.decide import decide
from controller.core.policy import get_policy
from controller.core.policy.learned import Learned, exchange_rate
from controller.core.state import FnState, Phase, Totals
from proto import commands as c
from proto import events as e
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
    stats = sim.states["fn"].stats
    assert stats.prewarms >= 25  # started ahead of the calls...
    # ...and not kept through the gaps: each slot lives about a start plus a run, not 30 s.
    assert run.slot_gb_s < 40 * 0.5 * 1.0


def test_prewarm_is_planned_just_before_the_predicted_arrival():
    period, start = 30_000, 150
    sim = simulate(dataset([n * period for n in range(20)]))
    s = sim.states["fn"]
    last = s.stats.last_arrival_ms
    plan = LEARNED.prewarm(s, last + 1_000)
    assert plan.count == 0 and plan.next_ms is not None
    assert last + period - 3 * start <= plan.next_ms <= last + period - start


def keep_after_one_call(memory_mb: int, policy: Learned = LEARNED) -> int:
    """How long the policy keeps an instance after a function's first (and only) call."""
    meta = e.Meta(memory_mb=memory_mb)
    s = FnState(key="fn")
    for cmd, now in [
        (c.Assign(key="fn", request_id="r1", meta=meta), 0),
        (c.SlotReady(key="fn", instance_id="fn-1", slot_id="s1"), 150),
        (c.Idle(key="fn", request_id="r1", instance_id="fn-1"), 200),
    ]:
        d = decide(s, cmd, now, policy)
        s = d.state
    (kept,) = [ev for ev in d.events if isinstance(ev, e.KeptAlive)]
    return kept.until_ms - 200


def test_a_function_seen_once_is_not_kept_for_long():
    demo = 5 * 60_000
    assert keep_after_one_call(512) < demo / 20


def test_a_large_function_is_kept_for_less_time_than_a_small_one():
    assert keep_after_one_call(4096) < keep_after_one_call(256)
    # with the same pattern of calls, history included
    arrivals = [n * 20_000 + (n % 3) * 4_000 for n in range(30)]
    small = simulate(dataset(arrivals, memory_mb=256)).result(arrivals[-1])
    large = simulate(dataset(arrivals, memory_mb=8192)).result(arrivals[-1])
    assert large.slot_gb_s / 32 < small.slot_gb_s  # per GB, the large one keeps less


def busy_function(run_ms: int, start_ms: int) -> FnState:
    """One instance busy since t=1000, with a history of `run_ms` runs and `start_ms` starts."""
    runs = (run_ms,) * 10
    stats = replace(FnState(key="fn").stats, runs=runs, start_ms=start_ms, gaps=(run_ms * 3,) * 10, arrivals=10)
    busy = {"fn-1": _instance("fn-1", Phase.BUSY, since=1_000)}
    return FnState(key="fn", meta=e.Meta(memory_mb=1024), instances=busy, stats=stats, started=1)


def _instance(id: str, phase: Phase, since: int):
    from controller.core.state import Instance

    return Instance(id=id, phase=phase, since_ms=since, memory_mb=1024, slot_id="s", request_id="r0")


def test_a_request_waits_for_a_busy_instance_when_that_is_cheaper_than_a_start():
    s = busy_function(run_ms=20, start_ms=3_000)
    d = decide(s, c.Assign(key="fn", request_id="r1", meta=e.Meta(memory_mb=1024)), 1_010, LEARNED)
    assert [type(ev).__name__ for ev in d.events] == ["RequestArrived", "RequestWaiting"]
    assert d.wake_ms is not None and d.wake_ms < 1_010 + 3_000  # it looks again if the wait runs long


def test_a_request_gets_a_new_instance_when_the_busy_one_runs_long():
    s = busy_function(run_ms=10_000, start_ms=100)
    d = decide(s, c.Assign(key="fn", request_id="r1", meta=e.Meta(memory_mb=1024)), 1_010, LEARNED)
    assert [type(ev).__name__ for ev in d.events] == ["RequestArrived", "SlotWanted"]


def test_spares_are_kept_for_instances_that_die_with_their_request():
    s = busy_function(run_ms=15, start_ms=3_000)
    healthy = LEARNED.pool_target(s, 1_010)
    dying = replace(s, stats=replace(s.stats, deaths=5, arrivals=100))  # 5% of requests kill their instance
    assert LEARNED.pool_target(dying, 1_010) > healthy


def test_exchange_rate_values_waiting_more_when_executions_are_tiny():
    # 30 ms runs, each costing a 150 ms gap at best; against 2 s runs with the same gaps
    tiny = Totals(exec_ms=60_000, exec_gb_ms=60_000 * 0.25, ideal_gb_ms=60_000 / 30 * 150 * 0.25)
    long = Totals(exec_ms=600_000, exec_gb_ms=600_000 * 0.5, ideal_gb_ms=600_000 / 2_000 * 150 * 0.5)
    assert exchange_rate(tiny) > exchange_rate(long) > 0
    assert exchange_rate(Totals(exec_ms=1_000, exec_gb_ms=1_000)) is None  # too little history yet


def test_the_run_totals_equal_the_sum_of_the_functions_stats():
    arrivals = [n * 700 for n in range(200)]
    sim = Simulation(dataset(arrivals, key="a"), LEARNED)
    sim.run()
    again = Totals()
    for s in sim.states.values():
        again = again.change(None, s)
    assert again == sim.totals and sim.totals.exec_ms == pytest.approx(200 * 50)
