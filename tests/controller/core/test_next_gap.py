"""A function's NextGap as the policy builds it when it asks, and what the learned policy reads from it.

Built from the one built last, however many gaps came since, it must be what building it whole from the stats
gives; the points read from it must be
those the gaps give worked out whole (`gap_points` below: how the policy read them on every decision before
the fold kept them); and the plans over them, worked out with prefix sums over every candidate at once, must
be the cheapest, as looking at each candidate apart finds (`keep_costs`, `restart_costs`).
"""

import math
from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.controller.core import folds
from scaler.controller.core.features import GAP_BINS, NO_STATS, UNKNOWN_START_MS, FnStats, gap_bin
from scaler.controller.core.next_gap import LOWER, MIDDLE, UPPER, Recent, build, spread
from scaler.controller.core.policy.forecast import (
    NEVER,
    Option,
    Points,
    keep_plan,
    own_points,
    restart_plan,
    served_within,
    share_by,
)
from scaler.controller.core.state import FnState
from scaler.proto import events as e

META = e.Meta(memory_mb=512)
# Gaps of every scale a function shows, and the same values again (a lull is among the gaps too, timers repeat).
gap = st.one_of(
    st.integers(0, 60),
    st.integers(60, 3_000),
    st.integers(3_000, 400_000),
    st.sampled_from([250, 1_000, 30_000, 60_000]),
)
step = st.one_of(st.tuples(st.just("call"), gap), st.tuples(st.just("start"), st.integers(20, 6_000)))
asked = st.lists(st.booleans(), min_size=1, max_size=110)  # whether the policy asks after each step


def burst(f: FnStats) -> int:
    return 2 * (f.start_ms or UNKNOWN_START_MS)


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=110), asked)
def test_built_from_the_last_one_it_is_what_the_stats_build_whole(steps, asks):
    """Asked after every call, or after several (a busy function planned every few groups), or after a start."""
    recent, s, t, asks_made = Recent(), (FnState(key="fn"), NO_STATS), 0, 0
    for n, (kind, ms) in enumerate(steps):
        if kind == "call":
            t += ms
            s = folds.apply(s, e.RequestArrived(at_ms=t, request_id=f"r{n}"))
        else:  # an instance that took `ms` to start: a new start, and what counts as a lull with it
            s = folds.apply(s, e.SlotWanted(at_ms=t, instance_id=f"i{n}", meta=META))
            t += ms
            s = folds.apply(s, e.InstanceReady(at_ms=t, instance_id=f"i{n}", slot_id=f"s{n}"))
        st_ = s[1]
        if asks[n % len(asks)] or n == len(steps) - 1:
            asks_made += 1
            assert recent.of("fn", st_.gaps, st_.lulls, st_.gap_hist, burst(st_)) == build(
                st_.gaps, st_.lulls, st_.gap_hist, burst(st_)
            )
    assert asks_made


def test_it_builds_from_the_last_one_only_the_bins_the_gaps_come_since_change(monkeypatch):
    """A few gaps since the last build: the bins they (and those they push out) do not touch are the last one's."""
    from scaler.controller.core import next_gap

    gaps = tuple(range(100, 6_500, 100))  # a full ring of 64 gaps, 0.1 s to 6.4 s
    hist = tuple(1.0 if i in {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25} else 0.0 for i in range(GAP_BINS))
    recent = Recent()
    before = recent.of("fn", gaps, (), hist, 0)
    later = (*gaps[3:], 150, 160, 170)  # three short gaps came, the three oldest went: bins 14-15 and their next
    hist_later = tuple(h + (1.0 if i == 14 else 0.0) for i, h in enumerate(hist))
    worked_out = []
    real = next_gap._points
    monkeypatch.setattr(next_gap, "_points", lambda i, *a: worked_out.append(i) or real(i, *a))
    after = recent.of("fn", later, (), hist_later, 0)
    assert worked_out and len(worked_out) < len(before.bins) // 2, worked_out
    assert after == build(later, (), hist_later, 0)
    assert recent.of("fn", later, (), hist_later, 0) is after  # the same stats: the same one, nothing built


def test_it_keeps_the_last_of_as_many_functions_as_it_may():
    recent = Recent(kept=2)
    hist = tuple(1.0 for _ in range(GAP_BINS))
    a = recent.of("a", (100, 200), (), hist, 0)
    recent.of("b", (300,), (), hist, 0)
    assert recent.of("a", (100, 200), (), hist, 0) is a  # asked lately: kept
    recent.of("c", (400,), (), hist, 0)  # b was the least lately asked
    assert set(recent._built) == {"a", "c"}


def history(gaps: list[int], start_ms: int) -> FnStats:
    s, t = (FnState(key="fn"), NO_STATS), 0
    s = folds.apply(s, e.SlotWanted(at_ms=t, instance_id="i", meta=META))
    s = folds.apply(s, e.InstanceReady(at_ms=start_ms, instance_id="i", slot_id="s"))
    for n, g in enumerate([0, *gaps]):
        t += g
        s = folds.apply(s, e.RequestArrived(at_ms=t, request_id=f"r{n}"))
    return s[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(gap, min_size=1, max_size=100), st.integers(20, 5_000), st.floats(0, 500_000))
def test_its_points_are_those_the_gaps_give_worked_out_whole(gaps, start_ms, elapsed):
    st_ = history(gaps, start_ms)
    points = own_points(build(st_.gaps, st_.lulls, st_.gap_hist, burst(st_)), elapsed, [])
    whole = gap_points(st_.gap_hist, st_.gaps + st_.lulls, elapsed, burst(st_))
    assert (points is None) == (not whole)
    if points is not None:
        assert by_place(points.pairs()) == by_place(whole)


def by_place(points: list[tuple[float, float]]) -> dict[float, float]:
    """The weight at each place, to 12 digits (a point standing for several alike is split back evenly)."""
    out: dict[float, float] = {}
    for x, w in points:
        out[x] = out.get(x, 0.0) + w
    return {x: float(f"{w:.12g}") for x, w in out.items()}


def gap_points(hist, recent, elapsed, spread_from):
    """The recent gaps' points, each bin's weight where they were, worked out from the whole history."""
    ordered = sorted(recent)
    points = []
    for i, w in enumerate(hist):
        if w <= 0:
            continue
        lo = bisect_left(ordered, LOWER[i]) if i else 0
        hi = bisect_left(ordered, UPPER[i]) if i < GAP_BINS - 1 else len(ordered)
        if hi > lo:
            factors = spread(ordered, lo, hi) if UPPER[i] > spread_from else [1.0]
            share = w / (hi - lo) / len(factors)
            points += [(g * f, share) for g in ordered[lo:hi] for f in factors if g * f > elapsed]
        elif UPPER[i] > elapsed:
            lower = LOWER[i] if i else 1.0
            if elapsed <= lower:
                points.append((MIDDLE[i], w))
            else:
                points.append((UPPER[i], w * math.log(UPPER[i] / elapsed) / math.log(UPPER[i] / lower)))
    return sorted(points)


def test_a_bins_weight_moves_to_its_end_once_the_time_since_is_inside_it():
    hist = [0.0] * GAP_BINS
    hist[gap_bin(10_000)] = 3.0  # gaps of ~10 s seen long ago, none recent
    gaps = build((), (), tuple(hist), 2_000)
    (before,) = own_points(gaps, 100.0, []).pairs()
    (inside,) = own_points(gaps, 9_000.0, []).pairs()
    assert before == (MIDDLE[gap_bin(10_000)], 3.0)
    assert inside[0] == UPPER[gap_bin(10_000)] and 0 < inside[1] < 3.0
    assert own_points(gaps, UPPER[gap_bin(10_000)], []) is None and build((), (), (), 2_000).bins == ()


# The plans: the cheapest over every candidate, as the policy looked for it before the prefix sums.

place = st.one_of(st.floats(1.0, 100_000.0), st.sampled_from([500.0, 1_000.0, 38_267.0]))  # some places again
weight = st.floats(0.001, 10.0)
points_ = st.lists(st.tuples(place, weight), min_size=1, max_size=60).map(sorted)
many_points = st.lists(st.tuples(place, weight), min_size=1, max_size=240).map(sorted)  # in runs, some skipped


def keep_costs(points, elapsed, miss, options):
    """What keeping until each point (with each option) costs, and not keeping: (cost, until, count)."""
    total = sum(w for _, w in points)
    out = [(total * miss, elapsed, options[0][0])]
    for value, _ in points:
        if value == NEVER:
            break
        caught = [(x, w) for x, w in points if x <= value]
        left = total - sum(w for _, w in caught)
        for k, gb, shortfall in options:
            cost = sum(w * (gb * (x - elapsed) + shortfall) for x, w in caught) + left * (gb * (value - elapsed) + miss)
            out.append((cost, value, k))
    return out


@settings(max_examples=300, deadline=None)
@given(many_points, st.floats(0, 2_000), st.floats(1.0, 1e6), st.floats(0.1, 8.0), st.integers(1, 4), st.floats(0, 1))
def test_a_keep_plan_is_the_cheapest_of_its_candidates(points, elapsed, miss, gb, need, shortfall):
    points = [(x, w) for x, w in points if x > elapsed]
    options = [Option(1, gb, shortfall * miss / 2), Option(need, gb * need, 0.0)] if need > 1 else [Option(1, gb, 0.0)]
    plan = keep_plan(Points.of(points), elapsed, miss, options)
    count = plan.count
    costs = keep_costs(points, elapsed, miss, options)
    cheapest = min(cost for cost, _, _ in costs)
    assert math.isclose(plan.cost, cheapest, rel_tol=1e-9, abs_tol=1e-6)
    chosen = [cost for cost, until, k in costs if until == plan.until and k == count]
    assert chosen and math.isclose(min(chosen), cheapest, rel_tol=1e-9, abs_tol=1e-6)


def restart_costs(points, elapsed, start, lam, miss, rate, options, candidates=16):
    """What each (ready, until, count) the restart plan looks at costs, with letting the next arrival miss."""
    xs = [x for x, _ in points if x != NEVER]
    total = sum(w for _, w in points)
    step_ = max(1, len(xs) // candidates)
    readies = sorted({x for x in xs[::step_] if x - start >= elapsed} | ({elapsed + start} if xs else set()))
    out = [(total * miss, None, None, None)]
    for ready in readies:
        early = sum(w for x, w in points if x < ready - start)
        waiting = [(x, w) for x, w in points if ready - start <= x < ready]
        base = early * miss + lam * sum(w * (ready - x) * (1 + rate * (ready - x) / 2) for x, w in waiting)
        later = xs[bisect_left(xs, ready) :]
        for until in [*later[:-1:step_], *later[-1:]]:
            served = [(x, w) for x, w in points if ready <= x <= until]
            late = total - early - sum(w for _, w in waiting) - sum(w for _, w in served)
            for k, gb, shortfall in options:
                held = gb * (sum(w for _, w in waiting) * start + sum(w * (start - ready + x) for x, w in served))
                held += sum(w for _, w in served) * shortfall
                out.append((base + held + late * (gb * (start + until - ready) + miss), ready, until, k))
    return out


@settings(max_examples=200, deadline=None)
@given(
    points_,
    st.floats(0, 2_000),
    st.floats(1.0, 3_000.0),
    st.floats(0.1, 100.0),
    st.floats(0, 0.01),
    st.integers(1, 3),
    st.booleans(),
)
def test_a_restart_plan_is_the_cheapest_of_its_candidates(points, elapsed, start, lam, rate, need, never):
    points = [(x, w) for x, w in points if x > elapsed] + ([(NEVER, 0.5)] if never else [])
    miss, gb = lam * start * 3, 0.5
    options = [Option(1, gb, lam * 10.0), Option(need, gb * need, 0.0)] if need > 1 else [Option(1, gb, 0.0)]
    found = restart_plan(Points.of(points), elapsed, start, lam, miss, rate, options)
    costs = restart_costs(points, elapsed, start, lam, miss, rate, options)
    cheapest = min(cost for cost, *_ in costs)
    if found is None:
        assert math.isclose(costs[0][0], cheapest, rel_tol=1e-9, abs_tol=1e-6)
        return
    plan, count = found, found.count
    assert math.isclose(plan.cost, cheapest, rel_tol=1e-9, abs_tol=1e-6)
    chosen = [cost for cost, ready, until, k in costs if (ready, until, k) == (plan.ready, plan.until, count)]
    assert chosen and math.isclose(min(chosen), cheapest, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 2.5, 40.0]), st.floats(0.001, 10.0)), min_size=1, max_size=40))
def test_points_at_one_place_weigh_their_weights_added_one_after_the_other(points):
    # Runs of any length (short ones are added up as arrays, long ones point by point): to the last bit what
    # adding them in order gives, so that a plan over them decides as the policy always has.
    points = sorted(points)
    found = Points.of(points)
    weights: dict[float, float] = {}
    counts: dict[float, int] = {}
    for x, w in points:
        weights[x] = weights[x] + w if x in weights else w
        counts[x] = counts.get(x, 0) + 1
    assert found.x.tolist() == list(weights) and found.w.tolist() == list(weights.values())
    assert (found.k is None) == (len(weights) == len(points))
    assert found.k is None or found.k.tolist() == list(counts.values())
    assert found.pairs() == [(x, weights[x] / counts[x]) for x in weights for _ in range(counts[x])]


@settings(max_examples=100, deadline=None)
@given(points_, st.floats(0, 100_000), st.floats(1, 3_000), st.floats(1.0, 1e5), st.floats(0.1, 50.0))
def test_shares_and_the_arrivals_a_start_misses_are_summed_as_the_points_say(points, until, start, miss, lam):
    total = sum(w for _, w in points)
    assert math.isclose(share_by(Points.of(points), until), sum(w for x, w in points if x <= until) / total)
    soon = start  # from the last arrival on
    expected = sum(w * min(miss, lam * (soon - x)) for x, w in points if x < soon)
    assert math.isclose(served_within(Points.of(points), start, miss, lam, 0.0), expected, rel_tol=1e-9, abs_tol=1e-6)


def test_gaps_with_no_width_in_log_scale_spread_as_one_gap_does():
    # Negative gaps (a lag from an event stamped in the future: a skewed clock) have no place in the log
    # scale the spread is read in; they spread as one gap does, not by a division by no gaps.
    one = spread([150], 0, 1)
    assert spread([-5], 0, 1) == one
    assert spread([-300, -250, -200], 0, 3) == [1.0]  # alike once below a ms, as gaps of 0 ms are
    assert spread([], 0, 0) == [1.0]
    assert spread([-5, 100, 140], 1, 3) == spread([100, 140], 0, 2)  # the negative one is not a neighbour
