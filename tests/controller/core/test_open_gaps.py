"""The run's open early gaps (Totals.early_open): bounded whatever the number of functions, and a sum over
functions, so that any order of folding, and any split over nodes, gives the same totals."""

import random

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.open_gaps import ACTIVE_MS, RESTED_MS
from scaler.controller.core.policy.forecast import new_function_points
from scaler.controller.core.state import FnState
from scaler.controller.core.totals import Totals

DAY_MS = 24 * 3_600_000
REST_MS = 10 * 60_000


Fn = tuple[FnState, FnStats]


def one_off(n: int, at_ms: int, now_ms: int, arrivals: int = 1) -> Fn:
    """A function seen `arrivals` times, last at `at_ms`; rested when idle for ten minutes by `now_ms`."""
    stats = FnStats(arrivals=arrivals, last_arrival_ms=at_ms)
    return FnState(key=f"f{n}", rested=now_ms - at_ms >= REST_MS), stats


def changed(totals: Totals, old: Fn | None, new: Fn | None) -> Totals:
    """The totals once one function (its state and features) `old` becomes `new`."""
    (s, was), (t, now) = old or (None, None), new or (None, None)
    return totals.change(s, t, was, now)


def test_a_day_of_a_hundred_thousand_one_off_functions_fits_in_a_few_kilobytes():
    now = DAY_MS
    totals = Totals()
    for n in range(100_000):
        totals = changed(totals, None, one_off(n, n * DAY_MS // 100_000, now))
    assert len(totals.early_open) == 100_000
    encoded = msgspec.msgpack.encode(totals)
    assert len(encoded) < 8_000, f"{len(encoded)} bytes"
    assert len(totals.early_open.active) <= REST_MS // ACTIVE_MS + 1
    assert len(totals.early_open.rested_n) <= DAY_MS // RESTED_MS


def test_the_totals_are_the_same_in_any_order_and_over_any_split():
    rng = random.Random(7)
    now = 3 * 3_600_000
    states = [one_off(n, rng.randrange(now), now, rng.randint(1, 4)) for n in range(2_000)]
    forward = Totals()
    for s in states:
        forward = changed(forward, None, s)
    rng.shuffle(states)
    halves = [Totals(), Totals()]
    for n, s in enumerate(states):
        halves[n % 2] = changed(halves[n % 2], None, s)
    assert halves[0].plus(halves[1]) == forward == halves[1].plus(halves[0])
    gone = Totals()
    for s in states:  # every function back once more, then forgotten: nothing stays open
        back = FnState(key=s[0].key), FnStats(arrivals=s[1].arrivals + 1, last_arrival_ms=now)
        gone = changed(changed(changed(gone, None, s), s, back), back, None)
    assert gone.early_open == Totals().early_open


def test_a_function_that_rests_moves_to_the_minutes_and_comes_back_to_the_seconds():
    fresh = one_off(1, 5_000, 6_000)
    rested = one_off(1, 5_000, 5_000 + REST_MS)
    totals = changed(Totals(), None, fresh)
    assert totals.early_open.active == (5,) and not totals.early_open.rested_n
    totals = changed(totals, fresh, rested)
    assert not totals.early_open.active and totals.early_open.rested_n == (1,)
    back = one_off(1, 700_000, 700_000, arrivals=2)
    assert changed(totals, rested, back).early_open.active == (700,)


def test_the_prior_from_the_counts_is_the_prior_from_the_exact_starts():
    """The Kaplan-Meier prior read from the blocks' middles, against the exact ages of the same gaps."""
    rng = random.Random(3)
    now = 2 * 3_600_000
    starts = [rng.randrange(now) for _ in range(500)]
    totals = Totals(early_gaps=tuple(rng.randint(0, 20) for _ in range(48)))
    for n, t in enumerate(starts):
        totals = changed(totals, None, one_off(n, t, now))
    exact = sorted((float(now - t), 1) for t in starts)
    for elapsed in (0.0, 30_000.0, 900_000.0):
        coarse = new_function_points(totals.early_gaps, totals.early_open.ages(now), elapsed)
        sharp = new_function_points(totals.early_gaps, exact, elapsed)
        mass = sum(w for _, w in sharp)
        assert abs(sum(w for _, w in coarse) - mass) < 0.02 * mass
        soon = sum(w for x, w in sharp if x < 2 * 3_600_000)
        assert abs(sum(w for x, w in coarse if x < 2 * 3_600_000) - soon) < 0.02 * mass
