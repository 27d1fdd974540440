"""The arithmetic of `learned`: when a function's next call comes, and what being ready for it costs.

Pure functions of a function's history (and of the run's, for functions too new to have one). Times
are ms after the function's last arrival; costs are GB·ms, waiting counted at `lam` GB·ms per ms
(the exchange rate, `exchange_rate`).
"""

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from scaler.controller.core.features import GAP_BINS

Point = tuple[float, float]  # (ms after the last arrival, weight)

LOWER = [2 ** (i / 2) for i in range(GAP_BINS)]  # edges of each gap bin (features.gap_bin), ms
UPPER = [2 ** ((i + 1) / 2) for i in range(GAP_BINS)]
MIDDLE = [2 ** ((i + 0.5) / 2) for i in range(GAP_BINS)]
NEVER = math.inf  # a gap that has not ended: no keep-alive catches it
PRIOR_WEIGHT = 1.0  # what the run's new functions weigh against a function's own gaps: one gap's worth
MIN_NEW_FUNCTIONS = 10  # gaps of new functions the run needs before they say anything


def gap_points(
    hist: tuple[float, ...], recent: tuple[int, ...], elapsed: float, spread_from: float = 0.0
) -> list[Point]:
    """The function's gaps still possible after `elapsed`, in order: each bin's (decayed) weight where its
    recent gaps were (a timer's period is where it is, not at its bin's middle), spread over the bin when
    none is recent.

    A recent gap says where the next may fall, give or take how much such gaps vary: each is spread
    over a few points around it (`_spread`), so that a burst's next lull, three of which were seen, may
    come later than all three. Only gaps from `spread_from` on (lulls: what pre-warms and holds are
    planned on); shorter ones, a busy function's many, stay where they were: dataSet_3 decides alike,
    in 184 s of simulation rather than 311.
    """
    ordered = sorted(recent)
    points = []
    for i, w in enumerate(hist):
        if w <= 0:
            continue
        lo = bisect_left(ordered, LOWER[i]) if i else 0
        hi = bisect_left(ordered, UPPER[i]) if i < GAP_BINS - 1 else len(ordered)
        if hi > lo:
            spread = _spread(ordered, lo, hi) if UPPER[i] > spread_from else [1.0]
            share = w / (hi - lo) / len(spread)
            points += [(g * f, share) for g in ordered[lo:hi] for f in spread if g * f > elapsed]
        elif UPPER[i] > elapsed:
            points += _rest_of_bin(i, w, elapsed)
    return sorted(points)


# Seven equally likely points of where the next gap falls, in sds of the log of such gaps from one seen:
# a normal's, or with few gaps seen Student's t with n - 1 degrees of freedom (t[n - 1]), as a prediction
# from a sample of n is.
KERNEL = (-1.465, -0.792, -0.366, 0.0, 0.366, 0.792, 1.465)
KERNEL_T = {
    1: (0.482, 1.254, 4.381),
    2: (0.422, 0.985, 2.353),
    3: (0.402, 0.913, 1.974),
    4: (0.393, 0.88, 1.82),
    5: (0.388, 0.861, 1.737),
    6: (0.384, 0.849, 1.686),
    8: (0.379, 0.834, 1.625),
    12: (0.375, 0.819, 1.568),
}
ONE_SPREAD = 0.1  # the sd of the log of gaps of a kind seen only once (a burst's first lull): about 10 %


def _spread(ordered: list[int], lo: int, hi: int) -> list[float]:
    """The factors, each as likely, by which the next gap like those in `ordered[lo:hi]` may differ from one
    of them: from the sd of their logs and their neighbours' (within a bin on either side), widened by
    sqrt(1 + 1/n) and Student's t, as a prediction from n samples is. From ROBUST_FROM gaps on, the sd is
    read from their median absolute deviation: a 30 s timer's neighbour of 20.4 s (one extra call split a
    period) made its sd of logs 0.08 and its next tick anywhere in 27-33 s, and the pre-warm came late."""
    near = ordered[bisect_left(ordered, ordered[lo] / SQRT2) : bisect_right(ordered, ordered[hi - 1] * SQRT2)]
    n = len(near)
    if n == 1:
        return [math.exp(z * ONE_SPREAD) for z in KERNEL]
    logs = [math.log(max(g, 1)) for g in near]
    if n >= ROBUST_FROM:  # the median absolute deviation: one odd gap beside a timer's does not smear it
        middle = _median(logs)
        sd = MAD_TO_SD * _median([abs(x - middle) for x in logs]) * math.sqrt(1 + 1 / n)
    else:
        mean = sum(logs) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1) * (1 + 1 / n))
    if sd == 0:  # a clock: every such gap alike
        return [1.0]
    t = next((q for dof, q in KERNEL_T.items() if dof >= n - 1), None)
    zs = KERNEL if t is None else (-t[2], -t[1], -t[0], 0.0, *t)
    return [math.exp(z * sd) for z in zs]


def lag_points(lags: tuple[int, ...], offset: float, elapsed: float, share: float) -> list[Point]:
    """Where a call that comes `lags` after an event may come, the event `offset` ms after the last arrival: each
    lag spread as a gap of its kind is (`_spread`), `share` in all; those still possible after `elapsed`."""
    ordered = sorted(lags)
    factors = _spread(ordered, 0, len(ordered))
    weight = share / len(ordered) / len(factors)
    return [(offset + lag * f, weight) for lag in ordered for f in factors if offset + lag * f > elapsed]


SQRT2 = math.sqrt(2)
ROBUST_FROM = 8  # gaps from which their spread is measured robustly
MAD_TO_SD = 1.4826  # a normal's sd per median absolute deviation
CLOCK_SHARE = 0.75  # the share of recent gaps on the beat that makes a function a clock's
BEAT_SDS = 4.0  # how far from the period a gap is still on the beat: in sds of the gaps (robust)...
BEAT_SHARE = 0.02  # ...or in shares of the period: a tick 10 ms late is no call besides the ticks


def since_beat(gaps: tuple[int, ...]) -> int:
    """How long before the last arrival a clock's last beat was, when the calls since were off it (0 when the
    last call was on it, or the function is not a clock's).

    A timer called besides its ticks (a cron job run by hand) keeps its beat: after a call 3.9 s past a 30 s
    timer's tick, the next tick comes 26.1 s later, not 30 s (dataSet_1's nodes1 missed the tick after each
    of its nine extra calls). A clock: most recent gaps near their median (a few robust sds, or 2 %).
    """
    if len(gaps) < ROBUST_FROM:
        return 0
    period = _median(list(gaps))
    tolerance = max(BEAT_SDS * MAD_TO_SD * _median([abs(g - period) for g in gaps]), BEAT_SHARE * period)
    if sum(1 for g in gaps if abs(g - period) <= tolerance) < CLOCK_SHARE * len(gaps):
        return 0
    off = 0
    for gap in reversed(gaps):
        if abs(gap - period) <= tolerance:
            break
        off += gap
    return int(off) if off < period - tolerance else 0  # the calls since the beat add up to a period: back on it


GROUPS_FROM = ROBUST_FROM  # groups of the current one's size (with the pauses after them) to read its rhythm from
GROUP_PAUSES_ALIKE = 1.25  # ...and those pauses alike: the longest at most this x the shortest


def group_pause(gaps: tuple[int, ...], burst: float) -> tuple[float, list[int]] | None:
    """For a function called in groups (calls closer than `burst`, then a pause): how likely the current group
    has ended, and the pauses that came after groups of its size, when enough came and they are alike.

    A client that makes five calls, then sleeps a second, has a next gap of tens of ms after its first four
    calls and of a second after its fifth; read as a whole, its gaps say a pause may come after any call and
    last 0.3-2 s, which keeps its instance through every pause (dataSet_1's roles1 and rolebindings1). A
    clock's calls are groups of one, read the same way. None when groups of this size were too few, or their
    pauses vary (a session's calls with no such rhythm).
    """
    size, ended = 0, []  # short gaps in the current group; (short gaps in a group, the pause after it)
    for gap in gaps:
        if gap > burst:
            ended.append((size, gap))
            size = 0
        else:
            size += 1
    ended = ended[1:]  # the first group's start came before the gaps kept
    reached = sum(1 for n, _ in ended if n >= size)
    pauses = sorted(gap for n, gap in ended if n == size)
    if len(pauses) < GROUPS_FROM or reached < GROUPS_FROM or pauses[-1] > GROUP_PAUSES_ALIKE * pauses[0]:
        return None
    return len(pauses) / reached, pauses


def in_group(points: list[Point], ended: float, pauses: list[int], elapsed: float, burst: float) -> list[Point]:
    """`points` with the group's rhythm (`group_pause`): gaps within a group as they were, weighing 1 - `ended`;
    the rest, `ended`, on the pauses after groups of this size, spread as such gaps vary. Once a pause has
    begun (`elapsed` past `burst`) the group has ended. Unchanged when every such pause is over."""
    total = sum(w for _, w in points)
    factors = _spread(pauses, 0, len(pauses))
    later = [p * f for p in pauses for f in factors if p * f > elapsed]
    if not later or not total:
        return points
    within = [(x, w) for x, w in points if x <= burst]
    share = sum(w for _, w in within)
    if not share:
        ended = 1.0
    out = [(x, w * (1 - ended) * total / share) for x, w in within] if ended < 1 else []
    out += [(x, ended * total / len(later)) for x in later]
    return sorted(out)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


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


def new_function_points(early_gaps: tuple[int, ...], open_ages: list[tuple[float, int]], elapsed: float) -> list[Point]:
    """How soon the run's functions came back while new, as a prior of weight PRIOR_WEIGHT; the part of it
    still possible after `elapsed`.

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
    if at_risk < MIN_NEW_FUNCTIONS:
        return []
    survive, points, longest = PRIOR_WEIGHT, [], 0.0
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
    """Instances ready at `ready` and held until `until` (ms after the last arrival), at an expected `cost`."""

    ready: float
    until: float
    cost: float


Option = tuple[int, float, float]  # instances, their GB in all, what an arrival they serve still costs


def keep_plan(points: list[Point], elapsed: float, miss: float, options: list[Option]) -> tuple[Plan, int]:
    """Keep instances that are ready now until the cheapest `until` (`elapsed`: not at all, every arrival
    misses), and how many: the cheapest of `options`.

    An arrival by `until` costs the memory until it (and what it still waits for want of more
    instances: an option's shortfall); a later one the memory until `until` and a miss.
    """
    total = sum(w for _, w in points)
    best, until, count = total * miss, elapsed, options[0][0]
    caught = [0.0] * len(options)
    caught_w = 0.0
    for value, w in points:
        if value == NEVER:
            break
        caught_w += w
        held, left = value - elapsed, total - caught_w
        for n, (k, gb, shortfall) in enumerate(options):
            caught[n] += w * (gb * held + shortfall)
            cost = caught[n] + left * (gb * held + miss)
            if cost < best:
                best, until, count = cost, value, k
    return Plan(elapsed, until, best), count


def restart_plan(
    points: list[Point],
    elapsed: float,
    start: float,
    lam: float,
    miss: float,
    rate: float,
    options: list[Option],
    candidates: int = 16,
) -> tuple[Plan, int] | None:
    """Start instances to be ready at `ready` >= elapsed + start and hold them until `until`, and how many:
    the cheapest such plan over `options`, or None when letting the next arrival miss costs less.

    An arrival before `ready - start` misses (nothing started yet); one before `ready` waits for the
    starting instances, and so do those arriving meanwhile at `rate` per ms; one after `until` misses
    after all, the instances' memory paid. An arrival served still costs the option's shortfall (its
    burst waiting for want of more instances).
    """
    xs = [v for v, _ in points if v != NEVER]
    total = sum(w for _, w in points)
    weight, first, second = [0.0], [0.0], [0.0]  # prefix sums of w, w x, w x^2
    for x, w in points:
        if x != NEVER:
            weight.append(weight[-1] + w)
            first.append(first[-1] + w * x)
            second.append(second[-1] + w * x * x)
    step = max(1, len(xs) // candidates)
    readies = sorted({x for x in xs[::step] if x - start >= elapsed} | ({elapsed + start} if xs else set()))
    best, plan = total * miss, None  # plan: (ready, until, count)
    for ready in readies:
        e1 = bisect_left(xs, ready - start)
        w1 = bisect_left(xs, ready)
        waiting, early = weight[w1] - weight[e1], weight[e1]
        # over the arrivals that wait, w (1 + rate w / 2) with w = ready - x
        wait = waiting * ready - (first[w1] - first[e1])
        wait2 = waiting * ready * ready - 2 * ready * (first[w1] - first[e1]) + (second[w1] - second[e1])
        base = early * miss + lam * (wait + rate * wait2 / 2)
        later = xs[w1:]
        for until in [*later[:-1:step], *later[-1:]]:  # and the longest gap: holding through it may be cheapest
            s1 = bisect_right(xs, until)
            served, served_x = weight[s1] - weight[w1], first[s1] - first[w1]
            late = total - early - waiting - served
            for k, gb, shortfall in options:
                held = gb * (waiting * start + served * (start - ready) + served_x) + served * shortfall
                cost = base + held + late * (gb * (start + until - ready) + miss)
                if cost < best:
                    best, plan = cost, (ready, until, k)
    return None if plan is None else (Plan(plan[0], plan[1], best), plan[2])


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
