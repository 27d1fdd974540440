"""The arithmetic of `learned`: when a function's next call comes, and what being ready for it costs.

Pure functions of a function's history (and of the run's, for functions too new to have one). Times
are ms after the function's last arrival; costs are GB·ms, waiting counted at `lam` GB·ms per ms
(the exchange rate, `exchange_rate`).

Where the next call may come is a set of weighted points (`Points`): the function's own, built as its gaps
come (scaler/controller/core/next_gap.py), and read here as a view from
the time since its last call on; or a list of points worked out for the call (`Points.of`). A plan
over them (`keep_plan`, `restart_plan`) is a search for the cheapest place to hold until, which with
the points' prefix sums costs a few lookups per candidate, all candidates at once (the points are numpy
arrays: `Points`).
"""

import math
from bisect import bisect_left
from dataclasses import dataclass
from itertools import compress, pairwise, repeat
from typing import Literal, NamedTuple

import numpy as np

from scaler.controller.core.next_gap import (
    LOWER,
    MAD_TO_SD,
    MIDDLE,
    ROBUST_FROM,
    UPPER,
    NextGap,
    median_of_ordered,
    spread,
)

Point = tuple[float, float]  # (ms after the last arrival, weight)

BOTTOM = (1.0, *LOWER[1:])  # where a bin's weight starts, as `_rest_of_bin` spreads it: bin 0 at 1 ms
NEVER = math.inf  # a gap that has not ended: no keep-alive catches it
# The defaults of what the functions below take as arguments: `learned` passes its config's (LearnedConfig).
PRIOR_WEIGHT = 1.0  # what the run's new functions weigh against a function's own gaps: one gap's worth
MIN_NEW_FUNCTIONS = 10  # gaps of new functions the run needs before they say anything


class Points(NamedTuple):
    """Where the next call may come, sorted: `x[lo:hi]` (ms after the last call, plus `shift`), each weighing `w`
    and standing for `k` points alike (None: one each), with the prefix sums `p` of w and `q` of w x over the
    whole arrays; and the weight `never` of a call that never comes.

    The arrays are numpy's (float64; `k` int64): a plan looks at every point, a few hundred, and numpy's
    elementwise arithmetic and running sums are the very IEEE operations Python's floats do, one by one, so
    a plan comes out the same to the last bit (never a pairwise `sum`, nor numpy's exp or log)."""

    x: np.ndarray
    w: np.ndarray
    k: np.ndarray | None
    p: np.ndarray
    q: np.ndarray
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
        never = sum(weight for _, weight in points[end:])
        x = np.fromiter((value for value, _ in points[:end]), np.float64, end)
        w = np.fromiter((weight for _, weight in points[:end]), np.float64, end)
        return _of(x, w, never)

    def __eq__(self, other: object) -> bool:
        """The same points (arrays equal element by element), the same view and the same weight never."""
        if not isinstance(other, Points):
            return NotImplemented
        return (
            (self.lo, self.hi, self.never, self.shift) == (other.lo, other.hi, other.never, other.shift)
            and all(map(np.array_equal, (self.x, self.w, self.p, self.q), (other.x, other.w, other.p, other.q)))
            and ((self.k is None) == (other.k is None))
            and (self.k is None or np.array_equal(self.k, other.k))
        )

    __hash__ = None  # type: ignore[assignment]

    def before(self, j: int) -> tuple[float, float]:
        """The prefix sums of w and w x before index j."""
        return (float(self.p[j - 1]), float(self.q[j - 1])) if j else (0.0, 0.0)

    @property
    def total(self) -> float:
        lo, hi = self.lo, self.hi
        return (float(self.p[hi - 1]) - (float(self.p[lo - 1]) if lo else 0.0) if hi > lo else 0.0) + self.never

    def pairs(self) -> list[Point]:
        """The points as a list, each of those it stands for apart (as `of` takes them), NEVER's last."""
        x, w = _apart(self)
        out = list(zip(x.tolist(), w.tolist(), strict=True))
        return [*out, (NEVER, self.never)] if self.never else out


def _of(x: np.ndarray, w: np.ndarray, never: float = 0.0) -> Points:
    """The points at `x` (in order), each weighing `w`; those at one place as one."""
    k = None
    if len(x) > 1 and (x[1:] == x[:-1]).any():
        x, w, k = _alike(x, w, np.ones(len(x), np.int64))
    return Points(x, w, k, np.cumsum(w), np.cumsum(w * x), 0, len(x), never)


ALIKE_AT_ONCE = 4  # runs of equal places up to this long are added up as arrays, longer ones point by point


def _alike(x: np.ndarray, w: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points at the same place as one (in order), weighing and standing for what they did in all: the weights
    of each run of equal places added one after the other, as a running sum does (a few runs of a few points
    at once; long runs, a point standing for many apart, one by one)."""
    n = len(x)
    first = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
    sizes = np.diff(np.append(first, n))
    if sizes.max() <= ALIKE_AT_ONCE:
        ws = w[first]
        for d in range(1, int(sizes.max())):
            more = sizes > d
            ws[more] += w[first[more] + d]
    else:
        weights, out = w.tolist(), []
        for i, size in zip(first.tolist(), sizes.tolist(), strict=True):
            total = weights[i]
            for weight in weights[i + 1 : i + size]:
                total += weight
            out.append(total)
        ws = np.array(out)
    return x[first], ws, np.add.reduceat(k, first)


def own_points(gaps: NextGap, elapsed: float, shorter: list[Point]) -> Points | None:
    """The function's own points still possible after `elapsed`, None when none is: each bin's weight where its
    recent gaps' points are (`next_gap.Bin`), or over the bin when it has none (`_rest_of_bin`); with them, the
    gaps shorter than any seen (`shorter`, in order). Each bin's points are in order, and mostly so are the
    bins: then they are only put one after the other."""
    hist = gaps.hist
    recent = {b.index: b for b in gaps.bins}
    x = [value for value, _ in shorter]  # the points, part after part (`shorter`, then bin after bin)...
    k = [1] * len(shorter)
    shares = [weight for _, weight in shorter]  # ...and each part's weight per gap, and its size
    sizes = [1] * len(shorter)
    last, in_order = x[-1] if shorter else -math.inf, True  # whether each part lies after the one before
    for i in compress(range(len(hist)), hist):
        b = recent.get(i)
        if b is None:
            if UPPER[i] > elapsed:
                ((value, weight),) = (
                    _rest_of_bin(i, hist[i], elapsed) if elapsed > BOTTOM[i] else ((MIDDLE[i], hist[i]),)
                )
                in_order &= last < value
                last = value
                x.append(value)
                k.append(1)
                shares.append(weight)
                sizes.append(1)
        elif (bx := b.x)[-1] > elapsed:
            in_order &= last < bx[0]
            last = bx[-1]
            x += bx
            k += b.k
            shares.append(hist[i] / b.count / b.width)
            sizes.append(len(bx))
    if not sizes:
        return None
    x, k = np.fromiter(x, np.float64, len(x)), np.fromiter(k, np.int64, len(k))
    w = np.array(shares).repeat(sizes) * k
    if not in_order:
        order = x.argsort(kind="stable")
        x, w, k = x[order], w[order], k[order]
        if (x[1:] == x[:-1]).any():  # points of two bins at the same place
            x, w, k = _alike(x, w, k)
    return Points(x, w, k, w.cumsum(), (w * x).cumsum(), int(x.searchsorted(elapsed, "right")), len(x))


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


class Beat(NamedTuple):
    """Where a clock's beat stands against its last call: how long before that call its last tick was, and how
    much later than its beat that tick came, earlier when negative (both 0 for a function that is not a clock's)."""

    since: int = 0
    late: float = 0.0


def beat(
    gaps: tuple[int, ...], clock_share: float = CLOCK_SHARE, beat_sds: float = BEAT_SDS, beat_share: float = BEAT_SHARE
) -> Beat:
    """A clock's beat (`Beat`). A timer called besides its ticks (a cron job run by hand) keeps its beat: after a
    call 3.9 s past a 30 s timer's tick, the next tick comes 26.1 s later, not 30 s (dataSet_1's nodes1 missed
    the tick after each of its nine extra calls). A tick may come late or early (`_late`). A clock: most recent
    gaps near their median (a few robust sds, or 2 %).
    """
    n = len(gaps)
    if n < ROBUST_FROM:
        return NO_BEAT
    ordered = sorted(gaps)
    period = median_of_ordered(ordered)
    if abs(gaps[-1] - period) <= beat_share * period:  # the last call on the beat, whatever the tolerance:
        return Beat(0, _late(gaps, period, beat_share * period))  # a clock if LATE_FROM ticks before it were too
    off_beat = np.abs(np.fromiter(ordered, np.float64, n) - period)  # each gap's distance from the period (exact)
    off_beat.sort()
    tolerance = max(beat_sds * MAD_TO_SD * float(median_of_ordered(off_beat)), beat_share * period)
    if int(off_beat.searchsorted(tolerance, "right")) < clock_share * n:
        return NO_BEAT
    off, calls = 0, 0
    for gap in reversed(gaps):
        if abs(gap - period) <= tolerance:
            break
        off += gap
        calls += 1
    if off >= period - tolerance:
        return NO_BEAT  # the calls since the tick add up to a period: back on the beat
    return Beat(int(off), _late(gaps[: n - calls], period, tolerance))


NO_BEAT = Beat()


LATE_FROM = ROBUST_FROM  # ticks on the beat, one after another, that say when the beat is...
LATE_OVER = 16  # ...the most recent of them, at most
LATE_SDS = 2.0  # ...and a tick is off its beat when further from it than this many robust sds of their gaps


def _late(gaps: tuple[int, ...], period: float, tolerance: float) -> float:
    """How much later than its beat a clock's last tick came (earlier when negative): against where each of the
    ticks before it (on the beat, one after another, at most LATE_OVER) puts it at the mean gap between
    them, the median.

    A gap ends on a tick and begins on one, so it varies by both ticks' lateness: after a tick 8 ms late the
    next gap is 8 ms short, shorter than any of its recent ones (dataSet_1's nodes1, whose ticks come 21 ms
    early to 13 ms late, waited a start at such a tick). A tick no further off than its gaps vary (LATE_SDS)
    is on the beat (0): their points spread that far already, and putting them twice would cost every
    decision of a clock that jitters (bench/hot_path.py's functions, called in turn every 0.8 s)."""
    run = []
    for gap in reversed(gaps):
        if abs(gap - period) > tolerance or len(run) == LATE_OVER:
            break
        run.append(gap)
    k = len(run)
    if k < LATE_FROM:
        return 0.0
    mean = sum(run[1:]) / (k - 1)  # the period as the ticks before the last keep it
    ahead, total = [], 0
    for j, gap in enumerate(run, 1):  # the last tick against the one j ticks before it
        total += gap
        ahead.append(total - j * mean)
    ahead.sort()
    late = median_of_ordered(ahead)
    if not late:
        return 0.0
    spread = LATE_SDS * MAD_TO_SD * median_of_ordered(sorted(abs(gap - mean) for gap in run[1:]))
    return late if abs(late) > spread else 0.0


def either_beat(points: Points, late: float, elapsed: float) -> Points:
    """After a tick `late` ms behind its clock's beat (ahead of it when negative): half the points' weight where
    they are (the beat moved with the tick) and half `late` sooner (it did not: the next tick comes a period
    after the beat); those still possible after `elapsed`. Nothing says yet which, and either way an instance
    held a few ms longer costs less than the start a miss would."""
    lo, hi = points.lo, points.hi
    x, w = points.x[lo:hi], points.w[lo:hi] / 2
    k = points.k[lo:hi] if points.k is not None else np.ones(hi - lo, np.int64)
    sooner = x - late
    still = sooner > elapsed
    x, w, k = np.concatenate((x, sooner[still])), np.concatenate((w, w[still])), np.concatenate((k, k[still]))
    order = x.argsort(kind="stable")
    x, w, k = x[order], w[order], k[order]
    if (x[1:] == x[:-1]).any():
        x, w, k = _alike(x, w, k)
    return Points(x, w, k, w.cumsum(), (w * x).cumsum(), 0, len(x), points.never, points.shift)


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
    later = np.multiply.outer(pauses, spread(pauses, 0, len(pauses))).ravel()  # each pause x each factor
    later = later[later > elapsed]
    if not len(later) or not total:
        return points
    if ended < 1:
        x, w = _apart(points)  # the points within a group: those by `burst`
        within = x <= burst
        x, w = x[within], w[within]
        share = sum(w.tolist())
        if share:
            w = np.concatenate((w * (1 - ended) * total / share, np.full(len(later), ended * total / len(later))))
            x = np.concatenate((x, later))
            order = np.lexsort((w, x))  # as the pairs sort
            return _of(x[order], w[order])
        ended = 1.0
    later.sort()
    return _of_equal(later, ended * total / len(later))


def _of_equal(x: np.ndarray, weight: float) -> Points:
    """`_of` for points (in order) that weigh the same: those at one place weigh what adding up their weights
    one after the other comes to (worked out once for each count)."""
    if len(x) < 2 or not (x[1:] == x[:-1]).any():
        w = np.full(len(x), weight)
        return Points(x, w, None, w.cumsum(), (w * x).cumsum(), 0, len(x))
    first = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
    k = np.diff(np.append(first, len(x)))
    sums = [weight]
    for _ in range(int(k.max()) - 1):
        sums.append(sums[-1] + weight)
    x, w = x[first], np.array(sums)[k - 1]
    return Points(x, w, k, w.cumsum(), (w * x).cumsum(), 0, len(x))


def _apart(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """`points.pairs()` as arrays, but for the weight never."""
    lo, hi, k = points.lo, points.hi, points.k
    x, w = points.x[lo:hi], points.w[lo:hi]
    if points.shift:
        x = x - points.shift
    if k is None:
        return x, w
    k = k[lo:hi]
    return np.repeat(x, k), np.repeat(w / k, k)


def _rest_of_bin(i: int, weight: float, elapsed: float) -> list[Point]:
    """A bin's weight, spread evenly over it in log scale, as far as it lies after `elapsed`: at its middle,
    or once `elapsed` is inside it (past `BOTTOM[i]`), at its end (so that looking again does not creep towards
    the end)."""
    lower = BOTTOM[i]
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
    point, an option costs, but for what does not depend on the point, gb x (`_held` less rho x p; see there).
    """
    x, p, q, lo, hi = points.x, points.p, points.q, points.lo, points.hi
    total, e = points.total, elapsed + points.shift
    best, until, count = total * miss, elapsed, options[0].count
    if hi <= lo:
        return Plan(elapsed, until, best, count)
    p0, q0 = points.before(lo)
    top = p0 + total
    held = _held(points, top)
    found = []
    for n, (_, gb, shortfall) in enumerate(options):
        j = lo + int((held - (miss - shortfall) / gb * p[lo:hi]).argmin())
        pj, qj, xj = float(p[j]), float(q[j]), float(x[j])
        caught = pj - p0
        cost = gb * (qj - q0 - e * caught) + shortfall * caught + (total - caught) * (gb * (xj - e) + miss)
        found.append((cost, j, n))
    cost, j, n = min(found)
    if cost < best:
        best, until, count = cost, float(x[j]) - points.shift, options[n].count
    return Plan(elapsed, until, best, count)


def _held(points: Points, top: float) -> np.ndarray:
    """What holding until each point of the view costs, per GB, but for what is the same for every point: its
    own and the earlier points' weight x their time (`q`), the later ones' (`top - p`) x its. Less `rho` (a
    miss, less an option's shortfall, per GB) x the weight it catches (`p`), a plan takes the least of it over
    the points (the first of equals): the first term grows along the points, the last falls."""
    lo, hi = points.lo, points.hi
    return points.q[lo:hi] + (top - points.p[lo:hi]) * points.x[lo:hi]


def restart_plan(
    points: Points,
    elapsed: float,
    start: float,
    lam: float,
    miss: float,
    rate: float,
    options: list[Option],
    candidates: int = 16,
    restart: float = 0.0,
) -> Plan | None:
    """Start instances to be ready at `ready` >= elapsed + start and hold them until `until`, and how many:
    the cheapest such plan over `options`, or None when letting the next arrival miss costs less.

    An arrival before `ready - start` misses (nothing started yet); one before `ready` waits for the
    starting instances, and so do those arriving meanwhile at `rate` per ms; one after `until` misses
    after all, the instances' memory paid. An arrival served still costs the option's shortfall (its
    burst waiting for want of more instances). Each instance started costs `restart` besides its memory
    (what the system it runs on makes a start cost: `Learned.outlook`), unless the arrival came first.

    Looked at: every `step`-th point (each apart, of `candidates`) to be ready at, and from there every
    `step`-th to hold until, and the last. Held until a point, an option costs what `_held` says but for
    what is the same for every until, so each ready's cheapest is the least of those values. Every ready
    and every until of each is worked out at once, as arrays (a row per ready).
    """
    x, p, q, lo, hi, shift = points.x, points.p, points.q, points.lo, points.hi, points.shift
    e = elapsed + shift
    total = points.total
    p0 = points.before(lo)[0]
    xs, ps, qs = x[lo:hi], p[lo:hi], q[lo:hi]
    # the points apart before each point from lo (and in all): the t-th apart is the point counts.searchsorted(t)
    counts = np.concatenate(((0,), points.k[lo:hi].cumsum())) if points.k is not None else None
    n = int(counts[-1]) if counts is not None else hi - lo
    step = max(1, n // candidates)
    firsts = np.arange(0, n, step)
    firsts = xs[counts[1:].searchsorted(firsts, "right") if counts is not None else firsts].tolist()
    readies = sorted({v for v in firsts if v - start >= e} | ({e + start} if n else set()))
    ready = np.array(readies)
    w1 = xs.searchsorted(ready, "left")
    if (m := int(w1.searchsorted(hi - lo))) < len(ready):  # none to hold for after these (the readies in order)
        ready, w1 = ready[:m], w1[:m]
    if not m:
        return None
    e1 = xs.searchsorted(ready - start, "left")
    # the prefix sums of w, w x and w x^2 before each index from lo on (index j at j - lo)
    before_p = p[lo - 1 : hi] if lo else np.concatenate(((0.0,), ps))
    before_q = q[lo - 1 : hi] if lo else np.concatenate(((0.0,), qs))
    before_r = np.concatenate(((0.0,), (points.w[lo:hi] * xs * xs).cumsum()))
    pe, qe, re = before_p[e1], before_q[e1], before_r[e1]
    pw, qw, rw = before_p[w1], before_q[w1], before_r[w1]
    early, waiting, sx = pe - p0, pw - pe, qw - qe
    # over the arrivals that wait, w (1 + rate w / 2) with w = ready - x
    wait = waiting * ready - sx
    wait2 = waiting * ready * ready - 2 * ready * sx + (rw - re)
    base = early * miss + lam * (wait + rate * wait2 / 2)
    # a row per ready: every step-th point (each apart) from its first on but the last, then the last (a row
    # runs on past it, and the least of a row is the first of equals: the last is taken where no other is as cheap)
    t0 = counts[w1] if counts is not None else w1
    columns = 1 - (1 - n) // step  # ceil((n - 1) / step) points, and one past them
    grid = np.minimum(t0[:, None] + np.arange(0, columns * step, step), n - 1)
    if counts is not None:
        grid = counts[1:].searchsorted(grid, "right")
    rows = np.arange(len(ready))
    held = _held(points, p0 + total)
    best_cost = best_j = best_n = None
    for n_option, (_, gb, shortfall) in enumerate(options):
        value = held - (miss - shortfall) / gb * ps
        j = grid[rows, value[grid].argmin(axis=1)]
        pj = ps[j]
        served, served_x = pj - pw, qs[j] - qw
        late = total - (pj - p0)
        cost = gb * (waiting * start + served * (start - ready) + served_x) + served * shortfall
        cost = base + cost + late * (gb * (start + xs[j] - ready) + miss)
        if restart:
            cost = cost + restart * options[n_option].count * (total - early)
        if best_cost is None:
            best_cost, best_j, best_n = cost, j, np.zeros(len(j), np.int64)
        else:  # the least (cost, until, option), as tuples compare
            better = (cost < best_cost) | ((cost == best_cost) & (j < best_j))
            best_cost, best_j = np.where(better, cost, best_cost), np.where(better, j, best_j)
            best_n = np.where(better, n_option, best_n)
    r = int(best_cost.argmin())  # the first ready of the least cost, as one after another, strictly less, would
    if not best_cost[r] < total * miss:
        return None
    until, count = float(xs[best_j[r]]) - shift, options[int(best_n[r])].count
    return Plan(float(ready[r]) - shift, until, float(best_cost[r]), count)


def share_by(points: Points, until: float) -> float:
    """The share of the points' weight at or before `until`."""
    total = points.total
    if not total:
        return 0.0
    j = _bisect(points, until + points.shift, "right")
    return (points.before(j)[0] - points.before(points.lo)[0]) / total


def served_within(points: Points, start: float, miss: float, lam: float, elapsed: float) -> float:
    """What the arrivals that come sooner than `start` after `elapsed` cost, none being served warm: each
    waits until then, at `lam` per ms, or misses (`miss`), whichever is less."""
    soon = elapsed + start + points.shift
    lo = points.lo
    end = _bisect(points, soon, "left")
    if end <= lo or lam <= 0:
        return 0.0
    cut = min(_bisect(points, soon - miss / lam, "right"), end)  # these wait longer than a miss costs
    p0, p_cut, p_end = points.before(lo)[0], points.before(cut)[0], points.before(end)[0]
    q_cut, q_end = points.before(cut)[1], points.before(end)[1]
    return miss * (p_cut - p0) + lam * (soon * (p_end - p_cut) - (q_end - q_cut))


def _bisect(points: Points, value: float, side: Literal["left", "right"]) -> int:
    """Where `value` goes among the view's points (`bisect_left` or `bisect_right` over x[lo:hi])."""
    return min(max(int(points.x.searchsorted(value, side)), points.lo), points.hi)


def scv(values: tuple[int, ...] | list[int]) -> float:
    """Squared coefficient of variation: 0 for a clock, 1 for exponential gaps, more for bursts."""
    if len(values) < 2:
        return 1.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 1.0
    # math.pow is libm's pow, as `**` is (x * x differs from it in the last bit now and then)
    return sum(map(math.pow, map(mean.__rsub__, values), repeat(2.0))) / len(values) / (mean * mean)


Bunches = tuple[tuple[int, int], ...]  # (a bunch's size, how many bunches of it), by size
NO_BUNCHES: Bunches = ()


def bunches(gaps: tuple[int, ...], window: float) -> Bunches:
    """The recent calls in bunches: a bunch is a call and those that follow it within `window` (a steady stream
    of calls closer than that is many bunches, not one). How many bunches of each size (a call alone is a bunch
    of one; the one still going counts as it is so far)."""
    sizes: dict[int, int] = {}
    size, span = 1, 0
    for gap in gaps:
        span += gap
        if span <= window:
            size += 1
        else:
            sizes[size] = sizes.get(size, 0) + 1
            size, span = 1, 0
    sizes[size] = sizes.get(size, 0) + 1
    return tuple(sorted(sizes.items()))


def bunch_wait(sizes: Bunches, run: float, k: int) -> float:
    """Expected ms a call waits for one of `k` free instances within its own bunch (`bunches`), each call running
    `run` ms: a bunch of x takes them k at a time, so its j-th call waits floor(j / k) runs. However idle the
    instances before it, a bunch larger than k queues, where Erlang C, which sees its calls come one at a time at
    their rate, says a few instances past the load hardly wait (20 calls within 10 ms, a second apart, of 50 ms
    runs: six instances, on which a call waits 1.2 runs on average)."""
    waited = calls = 0
    for x, n in sizes:
        q, r = divmod(x, k)
        waited += n * (k * q * (q - 1) // 2 + r * q)
        calls += n * x
    return run * waited / calls if calls else 0.0


def queue_wait(rate: float, run: float, k: int, variability: float, sizes: Bunches = NO_BUNCHES) -> float:
    """Expected ms an arrival waits for one of `k` instances, arrivals at `rate` per ms running `run` ms:
    Erlang C (M/M/k) scaled by `variability` (Allen-Cunneen), or, when it comes in bunches larger than k
    (`sizes`: `bunches`), at least what it waits within its bunch; without end when they cannot keep up."""
    load = rate * run
    if load >= k:
        return math.inf
    erlang_b = 1.0
    for j in range(1, k + 1):
        erlang_b = load * erlang_b / (j + load * erlang_b)
    erlang_c = k * erlang_b / (k - load * (1 - erlang_b))
    return max(variability * erlang_c * run / (k - load), bunch_wait(sizes, run, k))


def pool_size(rate: float, run: float, gb: float, lam: float, variability: float, sizes: Bunches = NO_BUNCHES) -> int:
    """Instances that minimise memory x k + lam x expected waiting, arrivals at `rate` per ms running `run` ms.

    Erlang C (M/M/k), scaled by (ca^2 + cs^2) / 2 (Allen-Cunneen; `variability`): a timer's
    arrivals queue far less than Poisson ones, a burst's more. Calls that come in bunches (`sizes`) wait at
    least within their bunch (`bunch_wait`), which falls only as k reaches the bunches' sizes.
    """
    load = rate * run
    k = max(1, math.ceil(load + 1e-9))
    erlang_b = 1.0
    for j in range(1, k + 1):
        erlang_b = load * erlang_b / (j + load * erlang_b)
    best = math.inf
    while True:  # the cost is convex in k: stop at its first rise
        erlang_c = k * erlang_b / (k - load * (1 - erlang_b))
        queued = lam * rate * variability * erlang_c * run / (k - load)
        cost = gb * k + max(queued, lam * rate * bunch_wait(sizes, run, k))
        if cost >= best:
            return k - 1
        best = cost
        k += 1
        erlang_b = load * erlang_b / (k + load * erlang_b)
