"""The arithmetic of `learned`: when a function's next call comes, and what being ready for it costs.

Pure functions of a function's history (and of the run's, for functions too new to have one). Times
are ms after the function's last arrival; costs are GB·ms, waiting counted at `lam` GB·ms per ms
(the exchange rate, `exchange_rate`).
"""

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from controller.core.features import GAP_BINS

Point = tuple[float, float]  # (ms after the last arrival, weight)

LOWER = [2 ** (i / 2) for i in range(GAP_BINS)]  # edges of each gap bin (features.gap_bin), ms
UPPER = [2 ** ((i + 1) / 2) for i in range(GAP_BINS)]
MIDDLE = [2 ** ((i + 0.5) / 2) for i in range(GAP_BINS)]
NEVER = math.inf  # a gap that has not ended: no keep-alive catches it
PRIOR_WEIGHT = 1.0  # what the run's new functions weigh against a function's own gaps: one gap's worth
MIN_NEW_FUNCTIONS = 10  # gaps of new functions the run needs before they say anything


def gap_points(hist: tuple[float, ...], recent: tuple[int, ...], elapsed: float) -> list[Point]:
    """The function's gaps still possible after `elapsed`, in order: each bin's (decayed) weight where its
    recent gaps were (a timer's period is where it is, not at its bin's middle), spread over the bin when
    none is recent."""
    ordered = sorted(recent)
    points = []
    for i, w in enumerate(hist):
        if w <= 0 or UPPER[i] <= elapsed:
            continue
        lo = bisect_left(ordered, LOWER[i]) if i else 0
        hi = bisect_left(ordered, UPPER[i]) if i < GAP_BINS - 1 else len(ordered)
        if hi > lo:
            share = w / (hi - lo)
            points += [(float(g), share) for g in ordered[max(lo, bisect_right(ordered, elapsed)) : hi]]
        else:
            points += _rest_of_bin(i, w, elapsed)
    return points


def _rest_of_bin(i: int, weight: float, elapsed: float) -> list[Point]:
    """A bin's weight, spread evenly over it in log scale, as far as it lies after `elapsed`: at its middle."""
    lower = LOWER[i] if i else 1.0
    if elapsed <= lower:
        return [(MIDDLE[i], weight)]
    left = math.log(UPPER[i] / elapsed) / math.log(UPPER[i] / lower)
    return [(math.sqrt(elapsed * UPPER[i]), weight * left)]


def beyond(elapsed: float, steps: int = 48) -> list[Point]:
    """After a gap longer than any seen: the longer it has lasted, the longer it may last. A Pareto tail
    (the chance to last past x is elapsed / x) in quarter-octave steps, the rest never."""
    points = [(elapsed * 2 ** (j / 4), 2 ** (-(j - 1) / 4) - 2 ** (-j / 4)) for j in range(1, steps + 1)]
    return [*points, (NEVER, 2 ** (-steps / 4))]


def new_function_points(early_gaps: tuple[int, ...], opened: int, elapsed: float) -> list[Point]:
    """How soon the run's functions came back while new (their first gaps, by bin, and those that have not
    come back yet: never), as a prior of weight PRIOR_WEIGHT; the part of it still possible after `elapsed`."""
    back = sum(early_gaps)
    if opened < MIN_NEW_FUNCTIONS:
        return []
    scale = PRIOR_WEIGHT / opened
    points = [
        p for i, n in enumerate(early_gaps) if n and UPPER[i] > elapsed for p in _rest_of_bin(i, n * scale, elapsed)
    ]
    if opened > back:
        points.append((NEVER, (opened - back) * scale))
    return points


def blend(own: list[Point], prior: list[Point]) -> list[Point]:
    return sorted(own + prior) if prior else own


@dataclass(frozen=True)
class Plan:
    """Instances ready at `ready` and held until `until` (ms after the last arrival), at an expected `cost`."""

    ready: float
    until: float
    cost: float


def keep_plan(points: list[Point], elapsed: float, gb: float, miss: float, shortfall: float = 0.0) -> Plan:
    """Keep an instance that is ready now: until the cheapest `until` (`elapsed`: not at all, every arrival misses).

    An arrival by `until` costs the memory until it (and `shortfall`: what its burst still waits for
    want of more instances); a later one the memory until `until` and a miss.
    """
    total = sum(w for _, w in points)
    best = Plan(elapsed, elapsed, total * miss)
    caught = caught_w = 0.0
    for value, w in points:
        if value == NEVER:
            break
        caught += w * (gb * (value - elapsed) + shortfall)
        caught_w += w
        cost = caught + (total - caught_w) * (gb * (value - elapsed) + miss)
        if cost < best.cost:
            best = Plan(elapsed, value, cost)
    return best


def restart_plan(
    points: list[Point],
    elapsed: float,
    start: float,
    gb: float,
    lam: float,
    miss: float,
    rate: float = 0.0,
    shortfall: float = 0.0,
    candidates: int = 16,
) -> Plan | None:
    """Start instances (of `gb` in all) to be ready at `ready` >= elapsed + start and hold them until `until`:
    the cheapest such plan, or None when letting the next arrival miss costs less.

    An arrival before `ready - start` misses (nothing started yet); one before `ready` waits for the
    starting instances, and so do those arriving meanwhile at `rate` per ms; one after `until` misses
    after all, the instances' memory paid. An arrival served still costs `shortfall` (its burst
    waiting for want of more instances).
    """
    xs = [v for v, _ in points if v != NEVER]
    ws = [w for v, w in points if v != NEVER]
    total = sum(w for _, w in points)
    weight, first, second = [0.0], [0.0], [0.0]  # prefix sums of w, w x, w x^2
    for x, w in zip(xs, ws, strict=True):
        weight.append(weight[-1] + w)
        first.append(first[-1] + w * x)
        second.append(second[-1] + w * x * x)

    def span(lo: float, hi: float, right: bool = False) -> tuple[int, int]:
        return bisect_left(xs, lo), (bisect_right if right else bisect_left)(xs, hi)

    step = max(1, len(xs) // candidates)
    readies = sorted({x for x in xs[::step] if x - start >= elapsed} | ({elapsed + start} if xs else set()))
    best, plan = total * miss, None
    for ready in readies:
        e0, e1 = span(-math.inf, ready - start)
        w0, w1 = span(ready - start, ready)
        waiting = weight[w1] - weight[w0]
        # over the arrivals that wait, w (1 + rate w / 2) with w = ready - x
        wait = waiting * ready - (first[w1] - first[w0])
        wait2 = waiting * ready * ready - 2 * ready * (first[w1] - first[w0]) + (second[w1] - second[w0])
        early = weight[e1] - weight[e0]
        base = early * miss + lam * (wait + rate * wait2 / 2) + waiting * gb * start
        for until in xs[bisect_left(xs, ready) :: step]:
            s0, s1 = span(ready, until, right=True)
            served, served_x = weight[s1] - weight[s0], first[s1] - first[s0]
            late = total - early - waiting - served
            held = gb * (served * (start - ready) + served_x) + served * shortfall
            cost = base + held + late * (gb * (start + until - ready) + miss)
            if cost < best:
                best, plan = cost, Plan(ready, until, cost)
    return plan


def share_by(points: list[Point], until: float) -> float:
    total = sum(w for _, w in points)
    return sum(w for value, w in points if value <= until) / total if total else 0.0


def scv(values: tuple[int, ...] | list[int]) -> float:
    """Squared coefficient of variation: 0 for a clock, 1 for exponential gaps, more for bursts."""
    if len(values) < 2:
        return 1.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 1.0
    return sum((v - mean) ** 2 for v in values) / len(values) / (mean * mean)


def pool_size(rate: float, run: float, gb: float, lam: float, variability: float) -> int:
    """Instances that minimise memory x k + lam x expected waiting, arrivals at `rate` per ms running `run` ms.

    Erlang C (M/M/k), scaled by (ca^2 + cs^2) / 2 (Allen-Cunneen; `variability`): a timer's
    arrivals queue far less than Poisson ones, a burst's more.
    """
    load = rate * run
    k = max(1, math.ceil(load + 1e-9))
    erlang_b = 1.0
    for j in range(1, k + 1):
        erlang_b = load * erlang_b / (j + load * erlang_b)
    best = math.inf
    while True:  # the cost is convex in k: stop at its first rise
        erlang_c = k * erlang_b / (k - load * (1 - erlang_b))
        cost = gb * k + lam * rate * variability * erlang_c * run / (k - load)
        if cost >= best:
            return k - 1
        best = cost
        k += 1
        erlang_b = load * erlang_b / (k + load * erlang_b)
