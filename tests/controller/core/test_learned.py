"""Our policy's behaviours that matter, pinned on the pure core."""

from typing import NamedTuple

import pytest
from msgspec.structs import replace

from scaler.controller.core.decide import decide
from scaler.controller.core.features import GAP_BINS, NO_STATS, START_MARGIN_MS, FnStats, gap_bin
from scaler.controller.core.policy import get_policy
from scaler.controller.core.policy.base import score_rate as exchange_rate
from scaler.controller.core.policy.learned import Delays, Learned, LearnedConfig
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.given import given

LEARNED = get_policy("learned")
COLD = "cold start: no idle instance"


class Fn(NamedTuple):
    """A function as a policy is given it: its state and its features (`*fn` in a policy's call)."""

    state: FnState
    features: FnStats

    def with_stats(self, **changed) -> "Fn":
        return self._replace(features=replace(self.features, **changed))

    def with_state(self, **changed) -> "Fn":
        return self._replace(state=replace(self.state, **changed))


def decide_on(fn: Fn, cmd: c.AnyCommand, now: int, policy: Learned = LEARNED):
    return decide(fn.state, cmd, now, policy, features=fn.features)


def keep_after_one_call(memory_mb: int, policy: Learned = LEARNED) -> int:
    """How long the policy keeps an instance after a function's first (and only) call."""
    meta = e.Meta(memory_mb=memory_mb)
    s, f = FnState(key="fn"), NO_STATS
    for cmd, now in [
        (c.Assign(key="fn", request_id="r1", meta=meta), 0),
        (c.SlotReady(key="fn", instance_id="fn-1", slot_id="s1"), 150),
        (c.Idle(key="fn", request_id="r1", instance_id="fn-1"), 200),
    ]:
        d = decide(s, cmd, now, policy, features=f)
        s, f = d.state, d.features
    (kept,) = [ev for ev in d.events if isinstance(ev, e.KeptAlive)]
    return kept.until_ms - 200


def test_a_function_seen_once_is_not_kept_for_long():
    demo = 5 * 60_000
    assert keep_after_one_call(512) < demo / 20


def test_a_large_function_is_kept_for_less_time_than_a_small_one():
    assert keep_after_one_call(4096) < keep_after_one_call(256)


def busy_function(run_ms: int, start_ms: int) -> Fn:
    """One instance busy since t=1000, with a history of `run_ms` runs and `start_ms` starts."""
    runs = (run_ms,) * 10
    stats = replace(NO_STATS, runs=runs, start_ms=start_ms, gaps=(run_ms * 3,) * 10, arrivals=10)
    busy = {"fn-1": _instance("fn-1", Phase.BUSY, since=1_000)}
    return Fn(FnState(key="fn", meta=e.Meta(memory_mb=1024), instances=busy, started=1), stats)


def _instance(id: str, phase: Phase, since: int):
    from scaler.controller.core.state import Instance

    return Instance(id=id, phase=phase, since_ms=since, memory_mb=1024, slot_id="s", request_id="r0")


def test_a_request_waits_for_a_busy_instance_when_that_is_cheaper_than_a_start():
    s = busy_function(run_ms=20, start_ms=3_000)
    assign = c.Assign(key="fn", request_id="r1", meta=e.Meta(memory_mb=1024))
    given(s=s, policy=LEARNED).when(assign, at=1_010).then(
        events=[
            e.RequestArrived(at_ms=1_010, request_id="r1"),
            e.RequestWaiting(
                at_ms=1_010,
                request_id="r1",
                expected_ms=1_020,
                why="wait ~10 ms for a busy instance rather than a 3000 ms start",
            ),
        ],
        wake_ms=1_025,  # it looks again if the wait runs long, well before a start would have come
    )


def test_a_request_gets_a_new_instance_when_the_busy_one_runs_long():
    s = busy_function(run_ms=10_000, start_ms=100)
    meta = e.Meta(memory_mb=1024)
    given(s=s, policy=LEARNED).when(c.Assign(key="fn", request_id="r1", meta=meta), at=1_010).then(
        events=[
            e.RequestArrived(at_ms=1_010, request_id="r1"),
            e.SlotWanted(at_ms=1_010, instance_id="fn-2", meta=meta, for_request="r1", reason=COLD),
        ],
        wake_ms=1_010 + 100 + START_MARGIN_MS,
    )


def test_spares_are_kept_for_instances_that_die_with_their_request():
    s = busy_function(run_ms=15, start_ms=3_000)
    healthy = LEARNED.pool_target(*s, 1_010)
    dying = s.with_stats(deaths=5, arrivals=100)  # 5% of requests kill their instance
    assert LEARNED.pool_target(*dying, 1_010) > healthy


def test_exchange_rate_values_waiting_more_when_executions_are_tiny():
    # 30 ms runs, each costing a 150 ms gap at best; against 2 s runs with the same gaps
    tiny = Totals(exec_ms=60_000, exec_gb_ms=60_000 * 0.25, ideal_gb_ms=60_000 / 30 * 150 * 0.25)
    long = Totals(exec_ms=600_000, exec_gb_ms=600_000 * 0.5, ideal_gb_ms=600_000 / 2_000 * 150 * 0.5)
    assert exchange_rate(tiny) > exchange_rate(long) > 0
    assert exchange_rate(Totals(exec_ms=500, exec_gb_ms=500)) is None  # too little history yet


def test_exchange_rate_is_read_at_the_runs_own_point_once_its_resource_score_is_spent():
    """Where the memory held has cost nearly all the resource score there is (below SPENT_SCORE of 50), more can cost
    little more, and the rate is the one at the run's own slot time and waiting, not the clairvoyant's."""
    e_s, e_gb_s, wait_s, now = 120.0, 60.0, 400.0, 3_600_000

    def run(held_gb_s: float, exec_s: float = e_s) -> Totals:  # held_gb_s of slot time by `now`, as one instance
        return Totals(
            exec_ms=exec_s * 1000,
            exec_gb_ms=e_gb_s * 1000,
            wait_ms=wait_s * 1000,
            ideal_gb_ms=90_000,
            memory_mb=1024,  # 1 GB held since the moment that makes `held_gb_s` by `now`
            slot_since=1024 * now / 1024 - held_gb_s * 1000,
        )

    clairvoyant = (e_gb_s + 90) ** 2 / (e_s * e_gb_s)
    spent = run(held_gb_s=50 * e_gb_s / 2)  # a resource score of 2
    assert spent.slot_gb_ms_at(now) == pytest.approx(1_500_000)
    own = e_s * 1_500**2 / (e_gb_s * (e_s + wait_s) ** 2)
    assert exchange_rate(spent, now) == pytest.approx(own) and own > clairvoyant
    assert exchange_rate(run(held_gb_s=50 * e_gb_s / 4), now) == pytest.approx(clairvoyant)  # a resource score of 4
    early = run(held_gb_s=50 * e_gb_s / 2, exec_s=30)  # spent too, but 30 s executed: any run's first starts look so
    assert exchange_rate(early, now) == pytest.approx((e_gb_s + 90) ** 2 / (30 * e_gb_s))


def periodic(period_ms: int, start_ms: int, calls: int = 20) -> Fn:
    """A function called every `period_ms` for a while, each call 50 ms, its instances taking `start_ms`; its
    last call at t=0 and nothing live."""
    gaps = (period_ms,) * calls
    hist = [0.0] * GAP_BINS
    hist[gap_bin(period_ms)] = float(calls)
    stats = replace(
        NO_STATS,
        arrivals=calls + 1,
        gaps=gaps,
        lulls=gaps,
        gap_hist=tuple(hist),
        runs=(50,) * calls,
        start_ms=start_ms,
        last_arrival_ms=0,
    )
    return Fn(FnState(key="fn", meta=e.Meta(memory_mb=1024), started=calls), stats)


def creating(id: str, wanted_ms: int, for_request: str = ""):
    from scaler.controller.core.state import Instance

    return Instance(
        id=id, phase=Phase.CREATING, since_ms=wanted_ms, memory_mb=1024, wanted_ms=wanted_ms, for_request=for_request
    )


def test_only_an_instance_started_for_a_predicted_arrival_is_held_for_it():
    period, start = 30_000, 2_000
    s = periodic(period, start)
    plan = LEARNED.prewarm(*s, 1_000)
    assert plan.count == 0 and plan.next_ms is not None and period - 2 * start < plan.next_ms <= period - start
    ahead = creating("fn-21", plan.next_ms)  # the pre-warm the plan asked for
    spare = creating("fn-22", plan.next_ms, for_request="r7")  # started for r7, which another instance served
    s = s.with_state(instances={"fn-21": ahead, "fn-22": spare})
    ready = plan.next_ms + start
    for inst, held in (("fn-21", True), ("fn-22", False)):
        d = decide_on(s, c.SlotReady(key="fn", instance_id=inst, slot_id=f"s-{inst}"), ready)
        (kept,) = [ev for ev in d.events if isinstance(ev, e.KeptAlive)]
        assert (kept.why == "pre-warmed: held through the predicted arrival") is held, kept
        if held:
            assert kept.until_ms > period  # through the predicted arrival, not just to it


def test_one_odd_gap_beside_a_timers_does_not_widen_where_its_next_tick_is_expected():
    # A 30 s timer with one extra call in its history (30 s became 20.4 s + 9.6 s): that gap's neighbour
    # of 20.4 s is near enough to count in the spread of the 30 s ones; its sd of logs made the next tick
    # anywhere in 27-33 s and the pre-warm came after it (dataSet_1's nodes1: 34 ticks in a row cold).
    gaps = (30_000,) * 10 + (29_996, 30_004) * 5 + (28_814, 20_444)
    hist = [0.0] * GAP_BINS
    for gap in gaps:
        hist[gap_bin(gap)] += 1
    points = own_points(gaps, tuple(hist))
    near_30s = sum(w for x, w in points if 28_700 <= x <= 30_050)
    assert near_30s >= 0.9 * sum(w for x, w in points if x >= 23_170)  # the 30 s bin's weight, where its gaps were


def own_points(gaps: tuple[int, ...], hist: tuple[float, ...]) -> list[tuple[float, float]]:
    """Where a function's own gaps put its next call, every bin spread (as a lull's), none ruled out yet."""
    from scaler.controller.core import next_gap
    from scaler.controller.core.policy import forecast

    points = forecast.own_points(next_gap.build(gaps, (), hist, burst=0), 0.0, [])
    return points.pairs() if points is not None else []


def sessions(period_ms: int, calls: int, lull_ms: int, lulls: int, start_ms: int, memory_mb: int = 256) -> Fn:
    """A function called in sessions (`calls` gaps of `period_ms`, runs as long) after `lulls` lulls of
    `lull_ms`; its last call at t=0 and nothing live."""
    gaps = (period_ms,) * calls + (lull_ms,) * lulls
    s = history(gaps, runs=(period_ms,) * calls, start_ms=start_ms, memory_mb=memory_mb)
    return s.with_stats(lulls=(lull_ms,) * lulls).with_state(started=lulls + 1)


def history(gaps: tuple[int, ...], runs: tuple[int, ...], start_ms: int, memory_mb: int) -> Fn:
    """A function with these recent gaps (all of its gap histogram) and runs; its last call at t=0."""
    hist = [0.0] * GAP_BINS
    for gap in gaps:
        hist[gap_bin(gap)] += 1
    stats = replace(
        NO_STATS,
        arrivals=len(gaps) + 1,
        gaps=gaps,
        gap_hist=tuple(hist),
        runs=runs,
        start_ms=start_ms,
        last_arrival_ms=0,
    )
    return Fn(FnState(key="fn", meta=e.Meta(memory_mb=memory_mb)), stats)


def starts_on_arrival(s: Fn, now: int) -> list[e.SlotWanted]:
    d = decide_on(s, c.Assign(key="fn", request_id="r1", meta=e.Meta(memory_mb=256)), now)
    return [ev for ev in d.events if isinstance(ev, e.SlotWanted)]


def test_a_session_that_finds_no_instance_starts_instances_for_the_calls_it_brings_within_a_start():
    # Calls every 30 ms that run 30 ms, instances taking 156 ms: a session that begins with nothing live
    # has five more calls before one instance is ready, and one instance drains them a run at a time
    # (dataSet_1's roles1: a session's first calls waited 156, 152, 121, 74, 46 ms).
    s = sessions(period_ms=30, calls=40, lull_ms=60_000, lulls=3, start_ms=156)
    starts = starts_on_arrival(s, 60_000)
    assert len(starts) > 1
    assert [w.for_request for w in starts].count("r1") == 1  # one for the request, the rest ahead of its session
    # A timer's next call is a period away: one start, for the request.
    timer = sessions(period_ms=30_000, calls=40, lull_ms=60_000, lulls=3, start_ms=156)
    assert [w.for_request for w in starts_on_arrival(timer, 60_000)] == ["r1"]


def test_a_timers_jitter_of_a_millisecond_still_spreads_where_its_next_tick_may_come():
    # Ticks 30 s apart give or take a few ms (most within 1 ms): the next may come after the longest of
    # the recent ones, and holding a pre-warmed instance a few ms more costs far less than that miss.
    gaps = (30_000,) * 12 + (29_999, 30_001) * 8 + (29_997, 30_004)
    hist = [0.0] * GAP_BINS
    hist[gap_bin(30_000)] = len(gaps)
    points = own_points(gaps, tuple(hist))
    assert max(x for x, _ in points) > max(gaps)


def test_a_return_plan_may_hold_through_the_longest_gap_seen():
    # 34 gaps, looked at every other one: the longest must still be a place to hold until, when a miss
    # costs far more than holding.
    from scaler.controller.core.policy.forecast import Option, Points, restart_plan

    points = Points.of([(10_000.0 + i, 1.0) for i in range(34)])
    plan = restart_plan(points, 0.0, start=100, lam=10.0, miss=1e6, rate=0.0, options=[Option(1, 0.5, 0.0)])
    assert plan.until == 10_033


def test_a_pre_warm_allows_for_a_next_gap_shorter_than_any_seen_as_far_as_the_gaps_vary():
    # Four gaps of 51-145 s (Poisson calls, a mean of 36 s, whose first gaps happened to be long): the next
    # is the shortest yet one time in five, and it would miss a 3.7 s start; a clock's next is not earlier.
    policy = Learned(LearnedConfig(wait_gb=88.0))
    varied = sessions(period_ms=51_000, calls=1, lull_ms=55_000, lulls=2, start_ms=3_742, memory_mb=2048)
    varied = varied.with_stats(gaps=(51_000, 55_000, 56_000, 145_000))
    assert policy.prewarm(*varied, 4_300).next_ms < 51_000 - 2 * 3_742 - 10_000
    clock = sessions(period_ms=60_000, calls=4, lull_ms=60_000, lulls=0, start_ms=3_742, memory_mb=2048)
    assert policy.prewarm(*clock, 4_300).next_ms > 60_000 - 2 * 3_742


def test_an_instance_retired_at_once_says_why():
    # A 30 s timer with a 2 s start: after a tick its instance is retired, to start again before the next;
    # the KeptAlive event says so (it said "no reason to keep it").
    s = periodic(30_000, 2_000)
    idle = replace(_instance("fn-20", Phase.IDLE, since=100), request_id="")
    kept = LEARNED.keep_alive(*s, idle, 100)
    assert kept.until_ms == 100 and kept.why == "cheaper to start again just before the next arrival"


def test_a_short_gap_by_chance_starts_nothing_ahead():
    # Three short gaps among thirty (Poisson calls: some come close by chance): a call after a lull brings
    # no follower on average, so only its own instance starts (gen-ramp/3 lost 0.9 to starts ahead).
    s = sessions(period_ms=30, calls=3, lull_ms=60_000, lulls=30, start_ms=156)
    assert [w.for_request for w in starts_on_arrival(s, 60_000)] == ["r1"]


def test_a_burst_served_by_one_ready_instance_queues_a_run_at_a_time_not_a_start():
    # Groups of five calls 26-75 ms apart, runs of 25-45 ms, groups 0.4-1 s apart (dataSet_1's roles1 in a
    # session); a start is 156 ms. Through the gap to the next group one instance is kept, not the two
    # a group keeps busy: a group's followers that find it busy wait for its run, not for a start.
    gaps = (26, 75, 40, 60, 900, 26, 75, 40, 60, 950, 26, 75, 40, 60, 400, 26, 75, 40, 60, 620) * 3
    s = history(gaps, runs=(25, 30, 35, 45) * 8, start_ms=156, memory_mb=256)
    idle = {f"fn-{i}": replace(_instance(f"fn-{i}", Phase.IDLE, since=30), request_id="") for i in (1, 2)}
    s = s.with_state(instances=idle, started=2)
    assert LEARNED.outlook(*s).need == 2
    lull = LEARNED.lull(*s, 313)
    until, count = lull.until_ms, lull.count  # past two starts: the group is over
    assert until > 313 and count == 1


def test_a_poisson_functions_next_call_may_come_sooner_than_the_shortest_recent_gap():
    # Calls at random (gen-poisson/2's poisson-3: 2 GB, a 3.7 s start), ten recent gaps of 18-200 s. Taken
    # as they are, no call comes within 18 s, and its instance was retired after each call to start again
    # later. Gaps that vary as an exponential's say how many shorter ones to expect: e^(-18.5/55) of them
    # are longer, so 28 % are shorter; the instance is kept.
    policy = Learned(LearnedConfig(wait_gb=88.0))
    gaps = (55_153, 55_997, 200_073, 50_772, 21_782, 34_358, 18_499, 29_913, 66_807, 18_486)
    s = history(gaps, runs=(50,) * 10, start_ms=3_742, memory_mb=2048)
    s = s.with_stats(lulls=gaps)
    idle = replace(_instance("fn-1", Phase.IDLE, since=50), request_id="")
    kept = policy.keep_alive(*s, idle, 50)
    assert kept.why == "keep through the burst, then look again"
    assert policy.keep_alive(*s, idle, kept.until_ms).until_ms > 18_000  # looked at again: still kept
    # A clock's calls do not vary so: its instance is still retired between ticks.
    assert policy.keep_alive(*periodic(30_000, 2_000), idle, 50).until_ms == 50
    # Calls that came at once (ten gaps of 0 ms) after lulls of a minute: no gap is shorter than theirs
    # (taken for an exponential's of mean 0, they divided by it).
    at_once = history((0,) * 10, runs=(50,) * 10, start_ms=150, memory_mb=256)
    hist = list(at_once.features.gap_hist)
    hist[gap_bin(60_000)] += 3
    at_once = at_once.with_stats(gap_hist=tuple(hist))
    assert policy.keep_alive(*at_once, idle, 50).why


def test_a_function_whose_lulls_end_at_random_is_not_retired_to_start_again_before_its_next_call():
    # gen-poisson/2's poisson-3 (2 GB, a 3.7 s start) at 628 s, the rate 831: its recent gaps put no weight
    # between 5.8 s and 18.5 s, so 7.5 s after its last call a return plan retired its instance to start
    # again for 15 s; the next call came at 11.4 s and found none. Lulls that vary as an exponential's end
    # as likely at any time: the instance is kept or let go, not retired to come back.
    policy = Learned(LearnedConfig(wait_gb=831.0))
    gaps = (55_153, 55_997, 200_073, 50_772, 21_782, 34_358, 18_499, 29_913, 66_807, 18_486, 276, 40_814, 5_766)
    lulls = tuple(gap for gap in gaps if gap > 2 * 3_742)
    poisson = history(gaps, runs=(50,) * len(gaps), start_ms=3_742, memory_mb=2048).with_stats(lulls=lulls)
    idle = replace(_instance("fn-1", Phase.IDLE, since=100), request_id="")
    after_burst = policy.keep_alive(*poisson, idle, 100).until_ms  # looked at again once no burst follows
    assert after_burst > 2 * 3_742
    kept = policy.keep_alive(*poisson, idle, after_burst)
    assert kept.why != "cheaper to start again just before the next arrival" and kept.until_ms > 11_401
    # Were eleven lulls too few to tell an exponential's, the holes would be taken as they are, as before.
    few = Learned(LearnedConfig(wait_gb=831.0, memoryless_from=len(lulls) + 1))
    assert few.keep_alive(*poisson, idle, after_burst).why == "cheaper to start again just before the next arrival"


def test_a_call_besides_a_timers_ticks_does_not_move_where_its_next_tick_is_expected():
    # A 30 s timer called once by hand 3.9 s after a tick: its next tick comes 26.1 s after that call, and the
    # pre-warm is for it (counted from the call, it came 3.9 s after the tick was due: dataSet_1's nodes1).
    start = 150
    ticks = (30_000, 29_998, 30_003, 29_999, 30_001) * 4
    s = history((*ticks, 3_884), runs=(50,) * 21, start_ms=start, memory_mb=512)
    plan = LEARNED.prewarm(*s, 1_000)
    assert plan.next_ms is not None and 26_116 - 2 * start < plan.next_ms <= 26_116 - start
    # The tick after that call is back on the beat; so is a tick 10 ms late, no call besides the ticks.
    for gaps in ((*ticks, 3_884, 26_116), (*ticks, 30_010)):
        plan = LEARNED.prewarm(*history(gaps, runs=(50,) * len(gaps), start_ms=start, memory_mb=512), 1_000)
        assert plan.next_ms is not None and 30_000 - 2 * start < plan.next_ms <= 30_000 - start


def test_after_a_tick_off_its_beat_the_next_is_expected_a_period_after_the_beat_or_after_that_tick():
    # A 30 s timer whose ticks come within 3 ms of its beat, then one 8 ms late: the next tick comes a period
    # after the beat, 29,992 ms after the late one, shorter than any recent gap (dataSet_1's nodes1 waited a
    # start at such a tick, its pre-warm ready 29,993 ms after); or the beat moved, and it comes 30,000 after.
    start = 150
    ticks = (30_000, 29_998, 30_003, 29_999, 30_001) * 4

    def plan(last: int):
        gaps = (*ticks, last)
        return LEARNED.return_plan(*history(gaps, runs=(50,) * len(gaps), start_ms=start, memory_mb=512), 1_000)

    on_beat, late, early = plan(30_000), plan(30_008), plan(29_992)
    assert on_beat.ready > 29_992 and on_beat.until < 30_008  # ticks on the beat: neither is held for
    assert late.ready <= 29_992 and late.until >= on_beat.until
    assert early.until >= 30_008 and early.ready <= on_beat.ready + 2  # its mirror: 8 ms after, or as before


def test_a_clocks_tick_is_late_against_the_ticks_before_it():
    from scaler.controller.core.policy.forecast import beat

    ticks = (30_000, 29_998, 30_003, 29_999, 30_001) * 4
    assert beat((*ticks, 30_008)).late == pytest.approx(8, abs=1)
    assert beat((*ticks, 29_992)).late == pytest.approx(-8, abs=1)
    assert beat((*ticks, 30_003)).late == 0  # off by no more than its gaps vary (a robust sd of 1.8 ms): on it
    assert beat((*ticks, 30_008, 3_884)) == (3_884, beat((*ticks, 30_008)).late)  # a call since the late tick
    assert beat((30_000, 12_000, 45_000, 7_000) * 5 + (30_008,)).late == 0  # no clock, no beat


def test_only_a_clock_called_off_its_beat_has_a_beat_to_count_from():
    from scaler.controller.core.policy.forecast import NO_BEAT, beat

    assert beat((30_000,) * 20 + (3_884,)).since == 3_884
    assert beat((30_000,) * 20 + (3_884, 26_116)) == NO_BEAT
    assert beat((30_000, 12_000, 45_000, 7_000) * 5 + (3_884,)) == NO_BEAT  # no period to keep
    assert beat((30_000,) * 5 + (3_884,)) == NO_BEAT  # too few gaps to tell


def in_groups(trailing: tuple[int, ...]) -> Fn:
    """Groups of five calls 25-70 ms apart, each followed by a pause of 930-990 ms (dataSet_1's roles1: a
    client that makes five calls, then sleeps a second), runs of 30 ms, starts of 156 ms; the last call
    after `trailing` gaps of the current group, at t=0, with one idle instance that served it."""
    group, pauses = (50, 25, 50, 70), (950, 930, 990, 945, 960, 940, 975, 955, 935, 965, 950, 980)
    gaps = (*(g for p in pauses for g in (*group, p)), *trailing)[-64:]
    s = history(gaps, runs=(30,) * 32, start_ms=156, memory_mb=256)
    idle = {"fn-1": replace(_instance("fn-1", Phase.IDLE, since=30), request_id="")}
    return s.with_state(instances=idle, started=1)


def test_a_function_called_in_groups_is_retired_after_a_group_to_start_again_before_the_next():
    # After a group's fifth call the next comes a pause later: the instance is retired, and one started to
    # be ready before the pause's end. (Taken as a whole, the gaps say the next may come after any call, 30
    # ms or a second later, which keeps the instance through every pause.)
    after_group = in_groups(trailing=(50, 25, 50, 70))
    kept = LEARNED.keep_alive(*after_group, after_group.state.instances["fn-1"], 30)
    assert kept.until_ms == 30 and kept.why == "cheaper to start again just before the next arrival"
    plan = LEARNED.prewarm(*after_group.with_state(instances={}), 30)
    assert plan.next_ms is not None and 930 - 2 * 156 < plan.next_ms <= 930 - 156
    # After its third call the next comes in tens of ms: the instance is kept.
    mid_group = in_groups(trailing=(50, 25))
    assert LEARNED.keep_alive(*mid_group, mid_group.state.instances["fn-1"], 30).until_ms > 30


def test_only_a_group_whose_pauses_are_alike_has_a_pause_to_expect():
    from scaler.controller.core.policy.forecast import group_pause

    group = (50, 25, 50, 70)
    alike = tuple(g for p in (950, 930, 990, 945, 960, 940, 975, 955, 935, 965) for g in (*group, p))
    found = group_pause((*alike, *group), burst=312)
    ended, pauses = found.ended, found.pauses
    assert ended == 1.0 and pauses == sorted((930, 990, 945, 960, 940, 975, 955, 935, 965))
    assert group_pause((*alike, 50, 25), burst=312) is None  # no group of two calls seen
    varied = tuple(g for p in (400, 930, 620, 1_900, 960, 450, 975, 700, 935, 1_500) for g in (*group, p))
    assert group_pause((*varied, *group), burst=312) is None  # pauses of 0.4-1.9 s: no rhythm
    assert group_pause((*alike[-25:], *group), burst=312) is None  # too few groups to tell


def test_a_leaders_return_stamped_in_the_future_spreads_its_lags_without_failing():
    # A skewed clock (issue 41): the leader's return stamped after the function's calls, so every lag it
    # gave is negative, and the start (ready stamped before wanted) too. Its lags have no width in the log
    # scale they spread in; they spread as one gap does, and the lull is decided, not a ZeroDivisionError.
    from scaler.controller.core.features import Leader

    s = history((5_000,) * 10, runs=(50,) * 10, start_ms=-400, memory_mb=512)
    lead = Leader(key="leader", lags=(-300, -250, -200), trials=20, hits=20)
    s = s.with_stats(leaders=(lead,), cues=(("leader", 100),))
    idle = {"fn-1": replace(_instance("fn-1", Phase.IDLE, since=30), request_id="")}
    s = s.with_state(instances=idle, started=1)
    nxt = LEARNED.next_arrival(*s, 200)
    assert nxt.timed and nxt.points.total > 0
    lull = LEARNED.lull(*s, 200)
    assert lull.until_ms >= 200 and lull.count >= 0 and lull.why


def test_with_nothing_measured_a_start_is_led_by_itself_and_costs_nothing_more():
    f = replace(NO_STATS, starts=(150,) * 16, late=(0,) * 16, overheads=(0,) * 32)
    assert Delays.of(f, 150, gb=0.25, lam=1_000.0, decisions=4) == Delays(150, 0.0, 0.0)
    assert Delays.of(NO_STATS, 150, gb=0.25, lam=5.0, decisions=4) == Delays(150, 0.0, 0.0)  # nothing folded yet


def test_a_start_is_led_past_the_longest_seen_as_far_as_waiting_is_dearer_than_memory():
    f = replace(NO_STATS, starts=(150, 170, 160, 210, 155, 180, 165, 175), late=(0, 3, 1, 12, 2))
    cheap, dear = Delays.of(f, 150, gb=0.25, lam=1.0, decisions=4), Delays.of(f, 150, gb=0.25, lam=1_000.0, decisions=4)
    assert cheap.lead == 210 + 12  # the longest start and the latest timer: waiting is not dear enough for more
    assert dear.lead > cheap.lead + 50 and dear.late < cheap.late  # a tail past them, and less risk of being late
    outage = replace(f, late=(*f.late, 3_600_000))  # a deadline acted on an hour late: an outage, not a timer
    assert Delays.of(outage, 150, gb=0.25, lam=1.0, decisions=4).lead == cheap.lead


def test_a_restart_costs_the_nodes_measured_time_for_its_decisions_as_waiting():
    f = replace(NO_STATS, starts=(150,) * 4, overheads=(2, 4, 6, 30, 4))  # the median call held 4 ms past its run
    assert Delays.of(f, 150, gb=0.25, lam=10.0, decisions=4).work == 10.0 * 4 * 4 / 2


def test_calls_in_bunches_keep_a_pool_as_large_as_a_bunch_where_as_many_one_at_a_time_keep_fewer():
    # 16 calls within 4 ms, then 1 s apart (64 gaps, four bunches), 50 ms runs: one instance busy on average.
    # Erlang C at that rate, scaled by how much the gaps vary, keeps a few instances; but a bunch of 16 on a few
    # queues for runs of 50 ms, however idle they were before it.
    gaps = (0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1_000) * 4
    runs = (50,) * 32
    policy = Learned(LearnedConfig(exchange_rate=100.0))
    s = history(gaps, runs, start_ms=3_000, memory_mb=1024)
    spread = history((1_004 // 16,) * 64, runs, start_ms=3_000, memory_mb=1024)  # as many calls, one at a time
    assert policy.pool_target(*s, 10) >= 16
    assert policy.pool_target(*spread, 10) < 8
    assert policy.outlook(*s).need >= 16


def test_a_share_of_the_gaps_weight_between_bursts_and_lulls_puts_a_next_call_where_none_came_yet():
    # Sessions of calls a second apart after lulls of 40 minutes to two hours (dataSet_1's rolebindings1 early on),
    # the last call three minutes ago. Its own gaps put nothing between a second and 40 minutes: a session back
    # after ten minutes is a surprise the forecast gives no chance, whatever a miss is worth. With `between_share`
    # that share of their weight is spread over the half-octaves where no gap came yet, each alike.
    from scaler.controller.core.policy.forecast import share_by

    lulls = (7_000_000, 2_500_000, 5_200_000)
    s = history((1_000,) * 40 + lulls, runs=(30,) * 40, start_ms=113, memory_mb=256).with_stats(lulls=lulls)
    now, ten_minutes = 180_000, 600_000

    def by_ten_minutes(share: float) -> float:
        points = Learned(LearnedConfig(between_share=share)).next_arrival(*s, now).points
        return share_by(points, ten_minutes)

    assert by_ten_minutes(0.0) == 0.0
    # 1 % of 43 gaps over the 26 empty half-octaves from two starts to the longest gap, about three of them from 3 to
    # 10 minutes, against the lulls' 3 gaps still to come
    assert 0.01 < by_ten_minutes(0.01) < 0.03
    assert by_ten_minutes(0.02) > by_ten_minutes(0.01)


def test_an_instance_still_starting_does_not_make_a_ready_one_surplus():
    # Calls ~0.4 s apart, 50 ms each, 150 ms starts: one instance is what the lulls need. A call found the ready
    # one busy and got a start; the ready one freed first and served it, so now it idles beside the one starting.
    # It is kept: the one starting may never be ready (the platform failing starts: the fault suite's failing
    # platform, where the retired one's next call failed with the start). Once both are ready, one is surplus.
    s = history((380, 420, 450, 400, 410) * 6, runs=(50,) * 30, start_ms=150, memory_mb=256)
    ready = replace(_instance("fn-1", Phase.IDLE, since=100), request_id="r9")
    s = s.with_state(instances={"fn-1": ready, "fn-2": creating("fn-2", wanted_ms=40)}, started=2)
    kept = LEARNED.keep_alive(*s, ready, 100)
    assert kept.until_ms > 100, kept
    both = s.with_state(instances={"fn-1": ready, "fn-2": replace(ready, id="fn-2", since_ms=150)})
    surplus = LEARNED.keep_alive(*both, both.state.instances["fn-2"], 150)
    assert surplus.until_ms == 150 and surplus.why.startswith("2 live, more than the lull's"), surplus
