"""The arithmetic of `learned`: when a function's next call comes, and what being ready for it costs.

Pure functions of a function's history (and of the run's, for functions too new to have one). Times
are ms after the function's last arrival; costs are GB·ms, waiting counted at `lam` GB·ms per ms
(the exchange rate, `exchange_rate`).

Where the next call may come is a set of weighted points (`Points`): the function's own, kept by the
features fold as its gaps come (scaler/controller/core/next_gap.py), and read here as a view from
the time since its last call on; or a list of points worked out for the call (`Points.of`). A plan
over them (`keep_plan`, `restart_plan`) is a search for the cheapest place to hold until, which with
the points' prefix sums costs a few lookups per candidate, and skips the runs of points whose least
possible cost is already beaten.
"""

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, islice, pairwise, repeat
from operator import add, eq, mul, sub
from typing import NamedTuple

from scaler.controller.core.next_gap import LOWER, MAD_TO_SD, MIDDLE, ROBUST_FROM, UPPER, NextGap, median, spread

Point = tuple[float, float]  # (ms after the last arrival, weight)

NEVER = math.inf  # a gap that has not ended: no keep-alive catches it
# The defaults of what the functions below take as arguments: `learned` passes its config's (LearnedConfig).
PRIOR_WEIGHT = 1.0  # what the run's new functions weigh against a function's own gaps: one gap's worth
MIN_NEW_FUNCTIONS = 10  # gaps of new functions the run needs before they say anything
RUN = 16  # points looked at together in a plan's search: a run is skipped when its least possible cost is beaten
ROUNDING = 1e-9  # relative: how far sums of many terms may be off, so that no run is skipped on rounding alone


class Points(NamedTuple):
    """Where the next call may come, sorted: `x[lo:hi]` (ms after the last call, plus `shift`), each weighing `w`
    and standing for `k` points alike (None: one each), with the prefix sums `p` of w and `q` of w x over the
    whole arrays; and the weight `never` of a call that never comes."""

    x: list[float]
    w: list[float]
    k: list[int] | None
    p: list[float]
    q: list[float]
    lo: int
    hi: int
    never: float = 0.0
    shift: float = 0.0

    @staticmethod
    def of(points: list[Point]) -> "Points":
        """These points (sorted; NEVER's last)."""
        end = len(points)
        while end and points[end - 1][0] == NEVER:
            end -= 1
        x = [value for value, _ in points[:end]]
        w = [weight for _, weight in points[:end]]
        never = sum(weight for _, weight in points[end:])
        k = None
        if any(map(eq, x, x[1:])):
            x, w, k = _alike(x, w, [1] * len(x))
        return Points(x, w, k, list(accumulate(w)), list(accumulate(map(mul, w, x))), 0, len(x), never)

    def before(self, j: int) -> tuple[float, float]:
        """The prefix sums of w and w x before index j."""
        return (self.p[j - 1], self.q[j - 1]) if j else (0.0, 0.0)

    @property
    def total(self) -> float:
        lo, hi = self.lo, self.hi
        return (self.p[hi - 1] - (self.p[lo - 1] if lo else 0.0) if hi > lo else 0.0) + self.never

    def pairs(self) -> list[Point]:
        """The points as a list, each of those it stands for apart (as `of` takes them), NEVER's last."""
        x, w, k, shift = self.x, self.w, self.k, self.shift
        if k is None:
            out = [(x[j] - shift, w[j]) for j in range(self.lo, self.hi)]
        else:
            out = []
            for j in range(self.lo, self.hi):
                out += [(x[j] - shift, w[j] / k[j])] * k[j]
        return [*out, (NEVER, self.never)] if self.never else out


def _alike(x: list[float], w: list[float], k: list[int]) -> tuple[list[float], list[float], list[int]]:
    """Points at the same place as one (in order), weighing and standing for what they did in all."""
    xs, ws, ks = [x[0]], [w[0]], [k[0]]
    for value, weight, count in zip(x[1:], w[1:], k[1:], strict=True):
        if value == xs[-1]:
            ws[-1] += weight
            ks[-1] += count
        else:
            xs.append(value)
            ws.append(weight)
            ks.append(count)
    return xs, ws, ks


def own_points(gaps: NextGap, elapsed: float, shorter: list[Point]) -> Points | None:
    """The function's own points still possible after `elapsed`, None when none is: each bin's weight where its
    recent gaps' points are (`next_gap.Bin`), or over the bin when it has none (`_rest_of_bin`); with them, the
    gaps shorter than any seen (`shorter`, in order). Each bin's points are in order, and mostly so are the
    bins: then they are only put one after the other."""
    hist = gaps.hist
    recent = {b.index: b for b in gaps.bins}
    xs: list[Sequence[float]] = []
    ws: list[Sequence[float]] = []
    ks: list[Sequence[int]] = []
    for i in compress(range(len(hist)), hist):
        weight = hist[i]
        b = recent.get(i)
        if b is None:
            if UPPER[i] > elapsed:
                ((x, w),) = _rest_of_bin(i, weight, elapsed)
                xs.append((x,))
                ws.append((w,))
                ks.append((1,))
        elif b.x[-1] > elapsed:
            share = weight / b.count / b.width
            xs.append(b.x)
            ws.append(list(map(share.__mul__, b.k)))
            ks.append(b.k)
    if not xs:
        return None
    if shorter:  # below the shortest gap, so mostly before the rest
        xs.insert(0, [x for x, _ in shorter])
        ws.insert(0, [w for _, w in shorter])
        ks.insert(0, [1] * len(shorter))
    in_order = all(a[-1] < b[0] for a, b in pairwise(xs))
    x, w, k = list(chain.from_iterable(xs)), list(chain.from_iterable(ws)), list(chain.from_iterable(ks))
    if not in_order:
        order = sorted(range(len(x)), key=x.__getitem__)
        x, w, k = list(map(x.__getitem__, order)), list(map(w.__getitem__, order)), list(map(k.__getitem__, order))
        if any(map(eq, x, islice(x, 1, None))):  # points of two bins at the same place
            x, w, k = _alike(x, w, k)
    p, q = list(accumulate(w)), list(accumulate(map(mul, w, x)))
    return Points(x, w, k, p, q, bisect_right(x, elapsed), len(x))


def lag_points(lags: tuple[int, ...], offset: float, elapsed: float, share: float) -> list[Point]:
    """Where a call that comes `lags` after an event may come, the event `offset` ms after the last arrival: each
    lag spread as a gap of its kind is (`next_gap.spread`), `share` in all; those still possible after `elapsed`."""
    ordered = sorted(lags)
    factors = spread(ordered, 0, len(ordered))
    weight = share / len(ordered) / len(factors)
    return [(offset + lag * f, weight) for lag in ordered for f in factors if offset + lag * f > elapsed]


CLOCK_SHARE = 0.75  # the share of recent gaps on the beat that makes a function a clock's
BEAT_SDS = 4.0  # how far from the period a gap is still on the beat: in sds of the gaps (robust)...
BEAT_SHARE = 0.02  # ...or in shares of the period: a tick 10 ms late is no call besides the ticks


def since_beat(
    gaps: tuple[int, ...], clock_share: float = CLOCK_SHARE, beat_sds: float = BEAT_SDS, beat_share: float = BEAT_SHARE
) -> int:
    """How long before the last arrival a clock's last beat was, when the calls since were off it (0 when the
    last call was on it, or the function is not a clock's).

    A timer called besides its ticks (a cron job run by hand) keeps its beat: after a call 3.9 s past a 30 s
    timer's tick, the next tick comes 26.1 s later, not 30 s (dataSet_1's nodes1 missed the tick after each
    of its nine extra calls). A clock: most recent gaps near their median (a few robust sds, or 2 %).
    """
    if len(gaps) < ROBUST_FROM:
        return 0
    period = median(list(gaps))
    off_beat = sorted(map(abs, map(period.__rsub__, gaps)))  # each gap's distance from the period
    tolerance = max(beat_sds * MAD_TO_SD * median(off_beat), beat_share * period)
    if bisect_right(off_beat, tolerance) < clock_share * len(gaps):
        return 0
    off = 0
    for gap in reversed(gaps):
        if abs(gap - period) <= tolerance:
            break
        off += gap
    return int(off) if off < period - tolerance else 0  # the calls since the beat add up to a period: back on it


GROUPS_FROM = ROBUST_FROM  # groups of the current one's size (with the pauses after them) to read its rhythm from
GROUP_PAUSES_ALIKE = 1.25  # ...and those pauses alike: the longest at most this x the shortest


@dataclass(frozen=True)
class GroupPause:
    """How likely the current group of calls has ended, and the pauses that came after groups of its size."""

    ended: float
    pauses: list[int]


def group_pause(
    gaps: tuple[int, ...], burst: float, groups_from: int = GROUPS_FROM, alike: float = GROUP_PAUSES_ALIKE
) -> GroupPause | None:
    """For a function called in groups (calls closer than `burst`, then a pause): how likely the current group
    has ended, and the pauses that came after groups of its size, when enough came and they are alike.

    A client that makes five calls, then sleeps a second, has a next gap of tens of ms after its first four
    calls and of a second after its fifth; read as a whole, its gaps say a pause may come after any call and
    last 0.3-2 s, which keeps its instance through every pause (dataSet_1's roles1 and rolebindings1). A
    clock's calls are groups of one, read the same way. None when groups of this size were too few, or their
    pauses vary (a session's calls with no such rhythm).
    """
    pause_at = [j for j, gap in enumerate(gaps) if gap > burst]
    size = len(gaps) - 1 - pause_at[-1] if pause_at else len(gaps)  # short gaps in the current group
    # (short gaps in a group, the pause after it); the first group's start came before the gaps kept
    ended = [(j - i - 1, gaps[j]) for i, j in pairwise(pause_at)]
    reached = sum(1 for n, _ in ended if n >= size)
    pauses = sorted(gap for n, gap in ended if n == size)
    if len(pauses) < groups_from or reached < groups_from or pauses[-1] > alike * pauses[0]:
        return None
    return GroupPause(len(pauses) / reached, pauses)


def in_group(points: Points, ended: float, pauses: list[int], elapsed: float, burst: float) -> Points:
    """`points` with the group's rhythm (`group_pause`): gaps within a group as they were, weighing 1 - `ended`;
    the rest, `ended`, on the pauses after groups of this size, spread as such gaps vary. Once a pause has
    begun (`elapsed` past `burst`) the group has ended. Unchanged when every such pause is over."""
    total = points.total
    factors = spread(pauses, 0, len(pauses))
    later = [p * f for p in pauses for f in factors if p * f > elapsed]
    if not later or not total:
        return points
    within = [(x, w) for x, w in _pairs_to(points, burst) if x <= burst]
    share = sum(w for _, w in within)
    if not share:
        ended = 1.0
    out = [(x, w * (1 - ended) * total / share) for x, w in within] if ended < 1 else []
    out += [(x, ended * total / len(later)) for x in later]
    return Points.of(sorted(out))


def _pairs_to(points: Points, until: float) -> list[Point]:
    """`points.pairs()`, but for (some of) those after `until`: the points lie in order."""
    if points.shift:
        return points.pairs()
    return points._replace(hi=bisect_right(points.x, until, points.lo, points.hi), never=0.0).pairs()


def _rest_of_bin(i: int, weight: float, elapsed: float) -> list[Point]:
    """A bin's weight, spread evenly over it in log scale, as far as it lies after `elapsed`: at its middle,
    or once `elapsed` is inside it, at its end (so that looking again does not creep towards the end)."""
    lower = LOWER[i] if i else 1.0
    if elapsed <= lower:
        return [(MIDDLE[i], weight)]
    left = math.log(UPPER[i] / elapsed) / math.log(UPPER[i] / lower)
    return [(UPPER[i], weight * left)]


def memoryless_below(shortest: float, mean: float, weight: float, elapsed: float, n: int = 16) -> list[Point]:
    """Where gaps shorter than `shortest` fall if they are an exponential's of this `mean`: its share of such
    gaps (1 - e^(-shortest / mean)) of `weight`, at n equally likely places; those still possible after
    `elapsed`."""
    below = 1 - math.exp(-shortest / mean)
    points = ((-mean * math.log(1 - (j + 0.5) / n * below), weight * below / n) for j in range(n))
    return [(x, w) for x, w in points if x > elapsed]


def beyond(elapsed: float, steps: int = 48) -> list[Point]:
    """After a gap longer than any seen: the longer it has lasted, the longer it may last. A Pareto tail
    (the chance to last past x is elapsed / x) in quarter-octave steps, the rest never."""
    points = [(elapsed * 2 ** (j / 4), 2 ** (-(j - 1) / 4) - 2 ** (-j / 4)) for j in range(1, steps + 1)]
    return [*points, (NEVER, 2 ** (-steps / 4))]


def new_function_points(
    early_gaps: tuple[int, ...],
    open_ages: list[tuple[float, int]],
    elapsed: float,
    weight: float = PRIOR_WEIGHT,
    min_new: int = MIN_NEW_FUNCTIONS,
) -> list[Point]:
    """How soon the run's functions came back while new, as a prior of weight `weight`; the part of it
    still possible after `elapsed`; none until `min_new` gaps of new functions are known.

    Their first gaps by bin (`early_gaps`), and the early gaps still open (`open_ages`: how long they
    have lasted, ascending, with how many have, OpenGaps.ages): those are only known to last longer
    than their age, so the chance to come back within each bin is the share of the gaps that reached
    it and ended in it (Kaplan-Meier). What lies past the oldest of them is not known: it follows the
    longest as `beyond` does.
    """
    ages = [age for age, _ in open_ages]
    below = [0]  # open gaps younger than each age, and in all
    for _, n in open_ages:
        below.append(below[-1] + n)
    at_risk = sum(early_gaps) + below[-1]
    if at_risk < min_new:
        return []
    survive, points, longest = weight, [], 0.0
    censored = 0  # open gaps no longer at risk: younger than the bins so far
    for i, ended in enumerate(early_gaps):
        young = below[bisect_left(ages, UPPER[i])] - censored  # open gaps whose age lies in this bin
        if ended:
            mass = survive * ended / at_risk
            if UPPER[i] > elapsed:
                points += _rest_of_bin(i, mass, elapsed)
            survive -= mass
            longest = UPPER[i]
        at_risk -= ended + young
        censored += young
        if at_risk <= 0:
            break
    if survive > 1e-9:
        longest = max(longest, ages[-1] if ages else 0.0, elapsed, 1.0)
        points += [(x, w * survive) for x, w in beyond(longest) if x > elapsed]
    return sorted(points)


def blend(own: list[Point], prior: list[Point]) -> list[Point]:
    return sorted(own + prior) if prior else own


@dataclass(frozen=True)
class Plan:
    """`count` instances ready at `ready` and held until `until` (ms after the last arrival), at an expected
    `cost`."""

    ready: float
    until: float
    cost: float
    count: int = 1


class Option(NamedTuple):
    """A way to be ready for the next arrival: `count` instances, `gb` their memory in all, and what an arrival
    they serve still costs (`shortfall`: its burst's followers waiting for want of more)."""

    count: int
    gb: float
    shortfall: float


def keep_plan(points: Points, elapsed: float, miss: float, options: list[Option]) -> Plan:
    """Keep instances that are ready now until the cheapest `until` (`elapsed`: not at all, every arrival
    misses), and how many: the cheapest of `options`.

    An arrival by `until` costs the memory until it (and what it still waits for want of more
    instances: an option's shortfall); a later one the memory until `until` and a miss. Held until a
    point, an option costs, but for what does not depend on the point, gb x `_value` (see there).
    """
    x, p, q, lo, hi = points.x, points.p, points.q, points.lo, points.hi
    total, e = points.total, elapsed + points.shift
    best, until, count = total * miss, elapsed, options[0].count
    if hi <= lo:
        return Plan(elapsed, until, best, count)
    p0, q0 = points.before(lo)
    top = p0 + total
    found = []
    for n, (_, gb, shortfall) in enumerate(options):
        j = _cheapest(points, top, (miss - shortfall) / gb, lo, hi)
        caught = p[j] - p0
        cost = gb * (q[j] - q0 - e * caught) + shortfall * caught + (total - caught) * (gb * (x[j] - e) + miss)
        found.append((cost, j, n))
    cost, j, n = min(found)
    if cost < best:
        best, until, count = cost, x[j] - points.shift, options[n].count
    return Plan(elapsed, until, best, count)


def _value(points: Points, top: float, rho: float, j: int) -> float:
    """What holding until point j costs, per GB, but for what is the same for every point: its own and the
    earlier points' weight x their time (`q`), the later ones' (`top - p`) x its, less `rho` (a miss, less an
    option's shortfall, per GB) x the weight it catches. The first term grows with j, the last falls."""
    pj = points.p[j]
    return points.q[j] + (top - pj) * points.x[j] - rho * pj


def _cheapest(points: Points, top: float, rho: float, lo: int, hi: int) -> int:
    """The point in [lo, hi) where `_value` is least (the first of equals): the value at each run's end bounds
    the least; a run whose first point's growing term less `rho` x its last point's weight cannot beat
    that bound (by more than the terms' rounding) is skipped."""
    x, p, q = points.x, points.p, points.q
    if hi - lo <= 2 * RUN:
        return _scan(points, top, rho, lo, hi)[0]
    ends = range(min(lo + RUN, hi) - 1, hi, RUN)
    bound = min(_value(points, top, rho, j) for j in ends)
    if hi - 1 not in ends:
        bound = min(bound, _value(points, top, rho, hi - 1))
    bound += ROUNDING * (abs(q[hi - 1]) + top * abs(x[hi - 1]) + rho * top)
    best_j, best = lo, math.inf
    for start in range(lo, hi, RUN):
        end = min(start + RUN, hi)
        if q[start] + (top - p[start]) * x[start] - rho * p[end - 1] > bound:
            continue
        j, value = _scan(points, top, rho, start, end)
        if value < best:
            best_j, best = j, value
    return best_j


def _scan(points: Points, top: float, rho: float, lo: int, hi: int) -> tuple[int, float]:
    x, p, q = points.x, points.p, points.q
    best_j, best = lo, math.inf
    for j in range(lo, hi):
        pj = p[j]
        value = q[j] + (top - pj) * x[j] - rho * pj
        if value < best:
            best_j, best = j, value
    return best_j, best


def restart_plan(
    points: Points,
    elapsed: float,
    start: float,
    lam: float,
    miss: float,
    rate: float,
    options: list[Option],
    candidates: int = 16,
) -> Plan | None:
    """Start instances to be ready at `ready` >= elapsed + start and hold them until `until`, and how many:
    the cheapest such plan over `options`, or None when letting the next arrival miss costs less.

    An arrival before `ready - start` misses (nothing started yet); one before `ready` waits for the
    starting instances, and so do those arriving meanwhile at `rate` per ms; one after `until` misses
    after all, the instances' memory paid. An arrival served still costs the option's shortfall (its
    burst waiting for want of more instances).

    Looked at: every `step`-th point (each apart, of `candidates`) to be ready at, and from there every
    `step`-th to hold until, and the last. Held until a point, an option costs what `_value` says but for
    what is the same for every until, so each ready's cheapest is the least of those values.
    """
    x, p, q, lo, hi, shift = points.x, points.p, points.q, points.lo, points.hi, points.shift
    e = elapsed + shift
    total = points.total
    p0, q0 = points.before(lo)
    counts = list(accumulate(points.k[lo:hi])) if points.k is not None else None  # points apart, up to each
    n = (counts[-1] if counts else 0) if counts is not None else hi - lo

    def entry(t: int) -> int:
        """The index of the t-th point (each apart) from `lo`."""
        return lo + (bisect_right(counts, t) if counts is not None else t)

    step = max(1, n // candidates)
    readies = sorted({v for t in range(0, n, step) if (v := x[entry(t)]) - start >= e} | ({e + start} if n else set()))
    if not readies:
        return None
    xs, ps = x[lo:hi], p[lo:hi]
    wx = list(map(mul, points.w[lo:hi], xs))
    r = list(accumulate(map(mul, wx, xs)))  # prefix sums of w x^2, from lo
    top = p0 + total
    held = list(map(add, q[lo:hi], map(mul, map(top.__sub__, ps), xs)))  # `_value` but for `rho` x p
    values = []  # per option: `_value` at each point, and at each point apart
    for _, gb, shortfall in options:
        value = list(map(sub, held, map(((miss - shortfall) / gb).__mul__, ps)))
        values.append((value, list(chain.from_iterable(map(repeat, value, points.k[lo:hi]))) if counts else value))

    # the prefix sums of w, w x and w x^2 before each index from lo on (index j at j - lo)
    before_p, before_q, before_r = [p0, *ps], [q0, *q[lo:hi]], [0.0, *r]

    best, plan = total * miss, None  # plan: (ready, until, count)
    for ready in readies:
        e1, w1 = bisect_left(x, ready - start, lo, hi), bisect_left(x, ready, lo, hi)
        if w1 >= hi:
            continue
        pe, qe, re = before_p[e1 - lo], before_q[e1 - lo], before_r[e1 - lo]
        pw, qw, rw = before_p[w1 - lo], before_q[w1 - lo], before_r[w1 - lo]
        early, waiting, sx = pe - p0, pw - pe, qw - qe
        # over the arrivals that wait, w (1 + rate w / 2) with w = ready - x
        wait = waiting * ready - sx
        wait2 = waiting * ready * ready - 2 * ready * sx + (rw - re)
        base = early * miss + lam * (wait + rate * wait2 / 2)
        t0 = (counts[w1 - lo - 1] if w1 > lo else 0) if counts is not None else w1 - lo
        found = []
        for n_option, (_, gb, shortfall) in enumerate(options):
            value, apart = values[n_option]
            j = hi - 1  # the last point, and every step-th from the ready's first on
            grid = apart[t0 : n - 1 : step]
            if grid and (least := min(grid)) <= value[-1]:
                j = entry(t0 + grid.index(least) * step)
            served, served_x = p[j] - pw, q[j] - qw
            late = total - (p[j] - p0)
            cost = gb * (waiting * start + served * (start - ready) + served_x) + served * shortfall
            found.append((base + cost + late * (gb * (start + x[j] - ready) + miss), j, n_option))
        cost, j, n_option = min(found)
        if cost < best:
            best, plan = cost, (ready - shift, x[j] - shift, options[n_option].count)
    return None if plan is None else Plan(plan[0], plan[1], best, plan[2])


def share_by(points: Points, until: float) -> float:
    """The share of the points' weight at or before `until`."""
    total = points.total
    if not total:
        return 0.0
    j = bisect_right(points.x, until + points.shift, points.lo, points.hi)
    return (points.before(j)[0] - points.before(points.lo)[0]) / total


def served_within(points: Points, start: float, miss: float, lam: float, elapsed: float) -> float:
    """What the arrivals that come sooner than `start` after `elapsed` cost, none being served warm: each
    waits until then, at `lam` per ms, or misses (`miss`), whichever is less."""
    soon = elapsed + start + points.shift
    lo = points.lo
    end = bisect_left(points.x, soon, lo, points.hi)
    if end <= lo or lam <= 0:
        return 0.0
    cut = min(bisect_right(points.x, soon - miss / lam, lo, end), end)  # these wait longer than a miss costs
    p0, p_cut, p_end = points.before(lo)[0], points.before(cut)[0], points.before(end)[0]
    q_cut, q_end = points.before(cut)[1], points.before(end)[1]
    return miss * (p_cut - p0) + lam * (soon * (p_end - p_cut) - (q_end - q_cut))


def scv(values: tuple[int, ...] | list[int]) -> float:
    """Squared coefficient of variation: 0 for a clock, 1 for exponential gaps, more for bursts."""
    if len(values) < 2:
        return 1.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 1.0
    return sum(map(pow, map(mean.__rsub__, values), repeat(2))) / len(values) / (mean * mean)


def queue_wait(rate: float, run: float, k: int, variability: float) -> float:
    """Expected ms an arrival waits for one of `k` instances, arrivals at `rate` per ms running `run` ms:
    Erlang C (M/M/k) scaled by `variability` (Allen-Cunneen); without end when they cannot keep up."""
    load = rate * run
    if load >= k:
        return math.inf
    erlang_b = 1.0
    for j in range(1, k + 1):
        erlang_b = load * erlang_b / (j + load * erlang_b)
    erlang_c = k * erlang_b / (k - load * (1 - erlang_b))
    return variability * erlang_c * run / (k - load)


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
