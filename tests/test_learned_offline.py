"""Our policy's behaviours over a run, in the offline simulator: what it learns from a function's history."""

import random

import pytest

from controller.core.policy import get_policy
from controller.core.state import FnState, Phase, Totals
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


class Recorded(Simulation):
    """The simulation, keeping each pre-warm (a start for no request, none waiting) with the function as it was
    when the pre-warm was decided; and the starts ahead of a burst's next calls (for no request, while some wait)."""

    def __init__(self, ds: Dataset, policy=LEARNED) -> None:
        super().__init__(ds, policy)
        self.prewarms: list[tuple[int, int, FnState]] = []  # (when, how many, the state before)
        self.ahead: list[int] = []  # how many, each time

    def command(self, cmd, now):
        before = self.ledger.state(cmd.key)
        d = super().command(cmd, now)
        started = [ev for ev in d.events if isinstance(ev, e.SlotWanted) and not ev.for_request]
        if started and d.state.queue:
            self.ahead.append(len(started))
        elif started:
            self.prewarms.append((now, len(started), before))
        return d


def bursts(count: int, size: int, within_ms: int, every_ms: int, seed: int = 1) -> list[int]:
    """`count` bursts of about `size` calls at random within `within_ms`, one every `every_ms` ± 20 %."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(count):
        arrivals += sorted(round(t + rng.uniform(0, within_ms)) for _ in range(round(size * rng.uniform(0.8, 1.2))))
        t += within_ms + every_ms * rng.uniform(0.8, 1.2)
    return arrivals


def test_a_burst_end_starts_no_pool_of_prewarms():
    # bursts of about 120 calls of 1.5 s within 3 s (about 60 instances busy), every 5 minutes; a 6 s start
    ds = dataset(bursts(10, 120, 3_000, 300_000), run_ms=1_500, memory_mb=1024, init_ms=6_000)
    sim = Recorded(ds)
    sim.run()
    start = sim.ledger.states["fn"].stats.start_ms
    assert sim.prewarms, "recurring bursts are pre-warmed"
    for now, count, before in sim.prewarms:
        live = [i for i in before.instances.values() if i.phase is not Phase.RETIRING]
        assert not live and not before.queue, f"pre-warm at {now} while the function had instances"
        assert now - before.stats.last_arrival_ms > 2 * start, f"pre-warm at {now}, at a burst's end"
        assert count <= 2 * 60, f"{count} instances pre-warmed at {now} for a burst that keeps about 60 busy"
    assert max(sim.ahead, default=0) <= 2 * 60, "starts ahead of a burst's calls: no more than it keeps busy"


def test_a_jittered_timer_with_a_long_init_is_warm_at_each_tick():
    period, jitter, init = 60_000, 500, 11_000
    arrivals = [n * period + (n * 37) % (2 * jitter) - jitter for n in range(1, 41)]
    ds = dataset(arrivals, run_ms=200, memory_mb=256, init_ms=init)
    sim = simulate(ds)
    run = sim.result(arrivals[-1] + 1_000)
    late = run.invocations[3:]  # once the period is learned
    assert max(i.schedule_ms for i in late) <= 2 * jitter, "every tick finds its instance started ahead of it"
    assert sum(i.schedule_ms > 0 for i in late) <= len(late) // 5
    # ...and it is not kept through the minutes between: a third of that at most (a start is 11 s)
    assert run.slot_gb_s < len(arrivals) * 0.25 * period / 1000 / 3
