"""Our policy's behaviours over a run, in the offline simulator: what it learns from a function's history."""

import random

import pytest

from scaler.controller.core import decide as core
from scaler.controller.core import folds
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.limits import NO_ROOM
from scaler.controller.core.policy import Capability, get_policy
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import events as e
from scaler.simulator.dataset import Dataset, FunctionMeta, Request
from scaler.simulator.latency import Latency, percentiles
from scaler.simulator.offline import Simulation

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
    stats = sim.ledger.features_of("fn")
    assert stats.prewarms >= 25  # started ahead of the calls...
    # ...and not kept through the gaps: each slot lives about a start plus a run, not 30 s.
    assert run.slot_gb_s < 40 * 0.5 * 1.0


def test_prewarm_is_planned_just_before_the_predicted_arrival():
    period, start = 30_000, 150
    sim = simulate(dataset([n * period for n in range(20)]))
    s, f = sim.ledger.states["fn"], sim.ledger.features_of("fn")
    last = f.last_arrival_ms
    plan = LEARNED.prewarm(s, f, last + 1_000)
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
    for key, s in sim.ledger.states.items():
        again = again.change(None, s, None, sim.ledger.features.get(key))
    assert again == sim.ledger.totals and sim.ledger.totals.exec_ms == pytest.approx(200 * 50)


class Recorded(Simulation):
    """The simulation, keeping each pre-warm (a start for no request, none waiting) with the function as it was
    when the pre-warm was decided; and the starts ahead of a burst's next calls (for no request, while some wait)."""

    def __init__(self, ds: Dataset, policy=LEARNED) -> None:
        super().__init__(ds, policy)
        self.prewarms: list[tuple[int, int, FnState, FnStats]] = []  # (when, how many, the state and features before)
        self.ahead: list[int] = []  # how many, each time

    def command(self, cmd, now):
        before, learned = self.ledger.state(cmd.key), self.ledger.features_of(cmd.key)
        d = super().command(cmd, now)
        started = [ev for ev in d.events if isinstance(ev, e.SlotWanted) and not ev.for_request]
        if started and d.state.queue:
            self.ahead.append(len(started))
        elif started:
            self.prewarms.append((now, len(started), before, learned))
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
    start = sim.ledger.features_of("fn").start_ms
    assert sim.prewarms, "recurring bursts are pre-warmed"
    for now, count, before, learned in sim.prewarms:
        live = [i for i in before.instances.values() if i.phase is not Phase.RETIRING]
        assert not live and not before.queue, f"pre-warm at {now} while the function had instances"
        assert now - learned.last_arrival_ms > 2 * start, f"pre-warm at {now}, at a burst's end"
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


def chained(lag_ms: int, jitter_ms: int = 50, returns: int = 30, seed: int = 1, at_ms: int = 0) -> Dataset:
    """`leader` comes back at irregular times (20 s to 2 minutes apart: its own history cannot say when), and
    `follower` is called `lag_ms` after each return, give or take `jitter_ms`: a function another one calls."""
    rng = random.Random(seed)
    metas = {
        "leader": FunctionMeta(key="leader", memory_in_mb=512, init_duration_in_ms=50),
        "follower": FunctionMeta(key="follower", memory_in_mb=256, init_duration_in_ms=30),
    }
    requests, t = [], at_ms
    for _ in range(returns):
        t += rng.randint(20_000, 120_000)
        requests += [Request(t, "leader", 40), Request(t + lag_ms + rng.randint(-jitter_ms, jitter_ms), "follower", 40)]
    return Dataset("chained", metas, requests)


def with_events(ds: Dataset) -> tuple[Simulation, list[e.Event]]:
    """The simulation run, and every event it decided."""
    sim, seen = Simulation(ds, LEARNED), []
    effect = sim.effect

    def recorded(key: str, event: e.Event, now: int) -> None:
        seen.append(event)
        effect(key, event, now)

    sim.effect = recorded
    sim.run()
    return sim, seen


def cued_prewarms(seen: list[e.Event]) -> list[e.SlotWanted]:
    return [event for event in seen if isinstance(event, e.SlotWanted) and "follows" in event.reason]


def follower_calls(sim: Simulation) -> list:
    run = sim.result(sim.end_ms)
    return [i for i, r in zip(run.invocations, sim.dataset.requests, strict=True) if r.meta_key == "follower"]


def test_a_function_another_one_calls_is_prewarmed_when_that_one_comes_back(monkeypatch):
    """Once its lead held (`lead_share`: nine in ten returns, eight straight at first), the follower is started at
    the leader's return and is ready for its call 400 ms later; before, and without the cue, each call waits."""
    sim, seen = with_events(chained(400))
    calls = follower_calls(sim)
    assert sum(i.cold for i in calls[12:]) == 0, [i.cold for i in calls]
    assert all(i.cold for i in calls[:9])  # the lead not learned yet
    assert len(cued_prewarms(seen)) >= 18
    lead = sim.ledger.features_of("follower").leaders
    assert [(x.key, x.trials == x.hits) for x in lead] == [("leader", True)] and lead[0].trials >= 25
    assert 350 <= min(lead[0].lags) and max(lead[0].lags) <= 450
    monkeypatch.setattr(type(LEARNED), "capabilities", Capability.NONE)
    blind = follower_calls(simulate(chained(400)))
    assert sum(i.cold for i in blind[12:]) >= 15


def test_a_leader_on_another_node_cues_its_follower_as_on_one_node():
    """Over two nodes the leader (partition 23) and the follower (6) are on different ones: told of the leader's
    returns (Ledger.hear), the follower learns the lead and is pre-warmed as on one node (the totals shared every
    second, as nodes do: their exchange rate is one node's)."""
    one, two = Simulation(chained(400), LEARNED), Simulation(chained(400), LEARNED, nodes=2, share_every_ms=1000)
    one.run(), two.run()
    assert two.ledger_of("leader") is not two.ledger_of("follower")
    assert [i.cold for i in follower_calls(two)] == [i.cold for i in follower_calls(one)]
    assert sum(i.cold for i in follower_calls(two)[12:]) == 0


def test_a_follower_called_sooner_than_a_start_after_its_leader_is_started_at_the_leaders_return(monkeypatch):
    """Called 10 ms after the leader comes back: no instance started then is ready for the call, but one started
    at the leader's return is ready 10 ms sooner than one the call starts itself, and the call waits that less."""
    sim, seen = with_events(chained(10, jitter_ms=5))
    lead = sim.ledger.features_of("follower").leaders
    assert lead and lead[0].hits >= 25
    soon = cued_prewarms(seen)
    assert len(soon) >= 15 and all("sooner than a start" in e.reason for e in soon), soon
    waited = [i.schedule_ms for i in follower_calls(sim)[12:]]
    monkeypatch.setattr(type(LEARNED), "capabilities", Capability.NONE)
    blind = [i.schedule_ms for i in follower_calls(simulate(chained(10, jitter_ms=5)))[12:]]
    assert all(w > 0 for w in waited)  # started at the leader's return, still not ready for the call
    assert sum(blind) / len(blind) - sum(waited) / len(waited) >= 5  # the lag: 5-15 ms


def test_functions_that_only_happen_to_come_back_together_do_not_follow_each_other():
    """Two functions called independently, often within a second of each other: each may take the other for a
    leader, but the trials fail and no pre-warm is made for them."""
    rng = random.Random(7)
    metas = {k: FunctionMeta(key=k, memory_in_mb=256, init_duration_in_ms=30) for k in ("a", "b")}
    requests = [Request(rng.randrange(0, 1_800_000), k, 40) for k in ("a", "b") for _ in range(400)]
    sim, seen = with_events(Dataset("apart", metas, sorted(requests, key=lambda r: r.start_time)))
    leaders = [x for f in sim.ledger.features.values() for x in f.leaders]
    assert leaders and any(isinstance(event, e.Cued) for event in seen), "together often enough to be tried"
    assert all(x.failed() for x in leaders if x.trials >= 10), leaders
    assert not cued_prewarms(seen)


# A node as one measures live (ms): each call's way in and out, a start's dispatch, its excess at the platform and
# its report, a destruction's way out and a timer's lateness, each spread over a range.
LIVE_NODE = Latency(
    source="a node as measured live",
    assign_in=percentiles(range(0, 5)),
    assign_out=percentiles(range(2, 21)),
    idle_in=percentiles(range(1, 11)),
    idle_out=percentiles(range(0, 3)),
    dispatch=percentiles(range(5, 31)),
    start_extra=percentiles(range(10, 61)),
    notify=percentiles(range(2, 11)),
    destroy=percentiles(range(5, 21)),
    timer=percentiles(range(0, 11)),
)


def round_robin(functions: int, every_ms: int, calls: int) -> Dataset:
    """bench/hot_path.py's round: `functions` functions of 128 MB called in turn, each every `every_ms`, 1 ms runs."""
    metas = {f"f{n}": FunctionMeta(key=f"f{n}", memory_in_mb=128, init_duration_in_ms=100) for n in range(functions)}
    step = every_ms // functions
    return Dataset("round", metas, [Request(n * step, f"f{n % functions}", 1) for n in range(calls)])


def test_on_a_node_as_measured_live_calls_0_8_s_apart_keep_their_instance():
    # With no latency, a start is sure and instant to order: retiring after each call and starting again just
    # before the next costs less memory, and nothing waits. On a node, a start may come late and each restart is
    # the node's work: the instance is kept between calls.
    ds = round_robin(functions=10, every_ms=800, calls=600)
    instant = Simulation(ds, LEARNED)
    assert instant.run().slots_created > 500
    live = Simulation(ds, LEARNED, latency=LIVE_NODE)
    run = live.run()
    assert run.slots_created == 10, "no restart between calls"
    assert sum(i.cold for i in run.invocations) == 10


def test_on_a_node_as_measured_live_a_timer_is_prewarmed_early_enough_for_its_slowest_starts():
    period = 30_000
    ds = dataset([n * period for n in range(40)], run_ms=40, memory_mb=512, init_ms=200)
    sim = Simulation(ds, LEARNED, latency=LIVE_NODE)
    run = sim.run()
    f = sim.ledger.features_of("fn")
    assert len(set(f.starts)) > 1, "the starts it measured vary"
    # Once the period is learned, every tick's instance is ready before it, but for one at most (its lead covers
    # the starts seen, and past the longest a start comes one time in n + 1); led by the last start alone, 12 of
    # these 28 ticks waited for theirs.
    assert sum(i.cold for i in run.invocations[12:]) <= 1
    assert run.slots_created >= 30, "and still retired between ticks: a tick is 30 s away, a start some 300 ms"


def test_replay_rebuilds_the_latency_it_measured_and_decides_the_same(monkeypatch):
    # The latency learned reads is folded from the events (starts, timers' lateness, calls' overheads): the
    # stream replayed gives the same features, and every decision taken again on them is the same.
    taken = []
    respond, plan = core.respond, core.plan

    def responding(s, cmd, now, policy, totals=None, room=NO_ROOM, features=NO_STATS):
        d = respond(s, cmd, now, policy, totals, room, features)
        taken.append((s.key, cmd, now, s, features, totals, room, d.events))
        return d

    def planning(s, now, policy, totals=None, room=NO_ROOM, features=NO_STATS):
        d = plan(s, now, policy, totals, room, features)
        taken.append((s.key, None, now, s, features, totals, room, d.events))
        return d

    monkeypatch.setattr(core, "respond", responding)
    monkeypatch.setattr(core, "plan", planning)
    period = 5_000
    metas = {
        "clock": FunctionMeta(key="clock", memory_in_mb=256, init_duration_in_ms=300),
        "busy": FunctionMeta(key="busy", memory_in_mb=128, init_duration_in_ms=100),
    }
    requests = [Request(n * period, "clock", 20) for n in range(30)] + [
        Request(n * 800 + 200, "busy", 20) for n in range(150)
    ]
    Simulation(Dataset("two", metas, sorted(requests, key=lambda r: r.start_time)), LEARNED, latency=LIVE_NODE).run()
    folded: dict[str, tuple[FnState, FnStats]] = {}
    measured = 0
    for key, cmd, now, state, learned, totals, room, events in taken:
        s, f = folded.get(key) or (FnState(key=key), NO_STATS)
        assert (s, f) == (state, learned), f"replay differs before the decision at {now}"
        measured += bool(f.overheads and f.late and len(set(f.starts)) > 1)
        if cmd is None:
            again = plan(s, now, LEARNED, totals, room, f)
        else:
            again = respond(s, cmd, now, LEARNED, totals, room, f)
        assert again.events == events, f"decided otherwise at {now}"
        folded[key] = folds.replay(s, f, events)
    assert measured > 100, "most decisions were taken with latency measured"


def test_a_busy_function_whose_calls_sometimes_kill_their_instance_keeps_its_pool():
    # Poisson calls, 50 a second, 13 ms runs, a 3 s start, one call in a hundred killing its instance (need_destroy):
    # each death is started again at once while the load needs it (a few find the pool already at the load's size,
    # instances still starting counted: 2 of 177 since learned stopped letting a ready one go for one starting).
    # Before, the pool grew only for waiting requests and eroded death by death: 951 calls after the first 10 s
    # waited for starts, 1,196 s in all.
    rng = random.Random(3)
    t, requests = 0.0, []
    while t < 300_000:
        t += rng.expovariate(1 / 20)
        requests.append(Request(round(t), "fn", 13, 500 if rng.random() < 0.01 else 200))
    meta = FunctionMeta(key="fn", memory_in_mb=1024, init_duration_in_ms=3_000)
    sim = Simulation(Dataset("deaths", {"fn": meta}, requests), LEARNED)
    run = sim.run()
    f = sim.ledger.features_of("fn")
    assert f.deaths > 150 and f.prewarms >= 0.95 * f.deaths, "deaths not started again"
    later = [i for r, i in zip(requests, run.invocations, strict=True) if r.start_time > 10_000]
    assert sum(i.cold for i in later) == 0 and sum(i.schedule_ms for i in later) < 1_000


@pytest.mark.parametrize("policy", ["demo", "learned"])
def test_a_function_whose_start_takes_40_s_is_served(policy):
    """Longer than a first start's bound (1 s assumed, plus its 30 s margin): the start given up as lost says how long
    starts take at least, so the next one is waited for long enough, where every start was given up for ever."""
    init_ms = 40_000
    sim = Simulation(dataset([0, 100_000, 101_000], init_ms=init_ms, run_ms=200), get_policy(policy))
    decide, decisions = sim.command, iter(range(1_000))

    def bounded(cmd, now):  # every start given up and another made would run for ever
        assert next(decisions, None) is not None, f"still deciding at {now} ms"
        return decide(cmd, now)

    sim.command = bounded
    sim.run()
    run = sim.result(400_000)
    assert [i.failed for i in run.invocations] == [False] * 3
    assert run.invocations[0].schedule_ms >= init_ms  # it waited for a start, not for ever
    assert run.slots_created <= 3  # the first given up once, then one that became ready (and perhaps a second)
    assert sim.ledger.features_of("fn").start_ms >= init_ms


def bunched(bursts: int, bunches: int, size: int, apart_ms: int, every_ms: int, seed: int = 1) -> list[int]:
    """`bursts` bursts, one every `every_ms` ± 20 %, each of `bunches` bunches about `apart_ms` apart, a bunch being
    `size` calls within 10 ms."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(bursts):
        at = t
        for _ in range(bunches):
            arrivals += [round(at + rng.uniform(0, 10)) for _ in range(size)]
            at += apart_ms * rng.uniform(0.5, 1.5)
        t += every_ms * rng.uniform(0.8, 1.2)
    return sorted(arrivals)


def test_calls_that_come_in_bunches_find_a_pool_as_large_as_a_bunch():
    # Bunches of 20 calls within 10 ms, a second apart, ten to a burst, a burst a minute; 50 ms runs, a 3 s start.
    # One call in 50 ms is a load of one instance, and Erlang C at that rate, even scaled by how the gaps vary,
    # says six instances hardly wait; but 20 calls at once on six wait 1.2 runs on average, 1.2 s a bunch: sized so,
    # the calls of the run's last half waited 120 s in all. The pool is sized for the bunches: none waits.
    arrivals = bunched(24, 10, 20, 1_000, 60_000)
    sim = simulate(dataset(arrivals, run_ms=50, memory_mb=1024, init_ms=3_000))
    run = sim.result(arrivals[-1] + 1_000)
    late = run.invocations[len(arrivals) // 2 :]
    assert sum(i.cold for i in late) <= len(late) // 100
    assert sum(i.schedule_ms for i in late) < 10 * 1_000, "calls within a bunch hardly queue"
