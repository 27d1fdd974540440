"""Where a function's recent gaps put its next one, built from its features when the learned policy asks.

The learned policy reads a function's next call from its recent gaps (policy/forecast.py): each half-octave
bin's decayed weight put where the recent gaps in it were, each of those spread over a few points as much
as such gaps vary (from a bin's lulls on). Worked out from scratch, that is most of what a decision costs,
many times between two calls; as the gaps come, a new gap changes only its bin and the two beside it
(whose spread it is read for), and so does the one it pushes out. So each bin's points are kept from one
decision to the next, and the policy puts the bins' weights on them when it asks (they decay with every
call, so they are not kept).

`NextGap` is a pure function of the stats it is built from (`build`): `build(..., prev)` gives what
`build(...)` gives, reusing `prev`'s bins where their gaps and neighbours are the same. So it is not kept in the
stats, where every policy's fold would pay for it at every call: it is built when a policy asks (`of`), from the
one last built for the function, which only saves work (`Recent`); replay and snapshots need nothing of it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict
from collections.abc import Sequence
from itertools import chain, islice, repeat
from operator import eq

import msgspec

GAP_BINS = 48  # inter-arrival histogram (features.gap_hist): half-octave bins from 1 ms to 4.6 h
RECENT_KEPT = 4096  # functions whose last NextGap is kept to build the next one from (`Recent`)
MOVED_AT_MOST = 8  # gaps come since the last NextGap built, up to which only their bins are built again

LOWER = tuple(2 ** (i / 2) for i in range(GAP_BINS))  # edges of each gap bin (features.gap_bin), ms
UPPER = tuple(2 ** ((i + 1) / 2) for i in range(GAP_BINS))
MIDDLE = tuple(2 ** ((i + 0.5) / 2) for i in range(GAP_BINS))

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
SQRT2 = math.sqrt(2)
ROBUST_FROM = 8  # gaps from which their spread is measured robustly
MAD_TO_SD = 1.4826  # a normal's sd per median absolute deviation


def spread(ordered: list[int] | tuple[int, ...], lo: int, hi: int) -> list[float]:
    """The factors, each as likely, by which the next gap like those in `ordered[lo:hi]` may differ from one
    of them: from the sd of their logs and their neighbours' (within a bin on either side), widened by
    sqrt(1 + 1/n) and Student's t, as a prediction from n samples is. From ROBUST_FROM gaps on, the sd is
    read from their median absolute deviation: a 30 s timer's neighbour of 20.4 s (one extra call split a
    period) made its sd of logs 0.08 and its next tick anywhere in 27-33 s, and the pre-warm came late.
    None (no gap) or negative ones (a lag from an event stamped in the future: a skewed clock) spread as
    one gap does, never by nothing."""
    if hi <= lo:
        return [1.0]
    first, last = ordered[lo], ordered[hi - 1]
    near = ordered[bisect_left(ordered, min(first, first / SQRT2)) : bisect_right(ordered, max(last, last * SQRT2))]
    n = len(near)
    if n == 1:
        return [math.exp(z * ONE_SPREAD) for z in KERNEL]
    logs = list(map(math.log, map(max, near, repeat(1))))
    if n >= ROBUST_FROM:  # the median absolute deviation: one odd gap beside a timer's does not smear it
        middle = median_of_ordered(logs)  # (the gaps are in order, and so are their logs)
        sd = MAD_TO_SD * median(list(map(abs, map(middle.__rsub__, logs)))) * math.sqrt(1 + 1 / n)
    else:
        mean = sum(logs) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1) * (1 + 1 / n))
    if sd == 0:  # a clock: every such gap alike
        return [1.0]
    t = next((q for dof, q in KERNEL_T.items() if dof >= n - 1), None)
    zs = KERNEL if t is None else (-t[2], -t[1], -t[0], 0.0, *t)
    return [math.exp(z * sd) for z in zs]


def median(values: list[float]) -> float:
    return median_of_ordered(sorted(values))


def median_of_ordered(ordered: Sequence[float]) -> float:
    """The median of values in order."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Bin(msgspec.Struct, frozen=True, array_like=True):
    """One bin's recent gaps (`count` of them, from `low` to `high`) and their points, in order: each distinct
    gap x each factor it is spread by (`width` of them; one, 1.0, for a busy function's bins below `burst`),
    with how many of the gaps each stands for."""

    index: int
    count: int
    width: int
    low: int
    high: int
    x: tuple[float, ...]
    k: tuple[int, ...]


class NextGap(msgspec.Struct, frozen=True, kw_only=True):
    """Where a function's recent gaps put its next one, before their weights: each bin's points (`Bin`), worked out
    as the gaps come. The weights are the bins' (`hist`), put on the points when asked (policy/forecast.own_points).

    Built from `gaps`, `lulls`, `hist` (those very tuples, so `fits` can tell in a moment) and `burst`: a gap
    longer than it is a lull (two of the function's starts), whose bins are spread.
    """

    gaps: tuple[int, ...] = ()
    lulls: tuple[int, ...] = ()
    hist: tuple[float, ...] = ()
    burst: int = 0
    bins: tuple[Bin, ...] = ()  # with recent gaps (and a weight)

    def fits(self, gaps: tuple[int, ...], lulls: tuple[int, ...], hist: tuple[float, ...], burst: int) -> bool:
        """Whether this was built from these stats (the fold's own, or equal ones)."""
        same = gaps is self.gaps and lulls is self.lulls and hist is self.hist
        if not same:
            same = gaps == self.gaps and lulls == self.lulls and hist == self.hist
        return same and burst == self.burst


NO_NEXT_GAP = NextGap()


class Recent:
    """The NextGap last built for each of the functions asked of lately, to build the next from: a cache, which
    changes no result (`build` gives the same from any `prev`), only what it costs."""

    def __init__(self, kept: int = RECENT_KEPT) -> None:
        self.kept = kept
        self._built: OrderedDict[str, NextGap] = OrderedDict()

    def of(
        self, key: str, gaps: tuple[int, ...], lulls: tuple[int, ...], hist: tuple[float, ...], burst: int
    ) -> NextGap:
        """The function's NextGap for these stats."""
        prev = self._built.get(key, NO_NEXT_GAP)
        if prev.fits(gaps, lulls, hist, burst):
            self._built.move_to_end(key)
            return prev
        built = self._built[key] = build(gaps, lulls, hist, burst, prev)
        self._built.move_to_end(key)
        if len(self._built) > self.kept:
            self._built.popitem(last=False)
        return built


recent = Recent()  # the process's: the policies of every ledger in it share it, as results do not depend on it


def build(
    gaps: tuple[int, ...], lulls: tuple[int, ...], hist: tuple[float, ...], burst: int, prev: NextGap = NO_NEXT_GAP
) -> NextGap:
    """The bins' points as these stats say. From `prev`, when these rings are its with a few gaps added (and as
    many of the oldest dropped, once full), only the bins those gaps change are worked out again."""
    ordered = sorted(gaps + lulls)
    gaps_moved, lulls_moved = _moved(prev.gaps, gaps), _moved(prev.lulls, lulls)
    if gaps_moved is None or lulls_moved is None:
        bins = _bins(ordered, hist, burst)
    else:
        flipped = set()  # a new start moves the bins between the old and the new `burst` to the other side of it
        if burst != prev.burst:
            flipped = {b.index for b in prev.bins if (UPPER[b.index] > burst) != (UPPER[b.index] > prev.burst)}
        bins = _rebinned(ordered, hist, burst, prev.bins, gaps_moved + lulls_moved, flipped)
    return NextGap(gaps=gaps, lulls=lulls, hist=hist, burst=burst, bins=bins)


def _bins(ordered: list[int], hist: tuple[float, ...], burst: int) -> tuple[Bin, ...]:
    """Each bin with recent gaps (and a weight), and their points: from `burst` on (a lull's bins) spread as much
    as such gaps vary, below it not at all (a busy function's many short gaps stay where they were)."""
    out = []
    lo, n = 0, len(ordered)
    while lo < n:
        i = _bin(ordered[lo])
        hi = bisect_left(ordered, UPPER[i], lo) if i < GAP_BINS - 1 else n
        if i < len(hist) and hist[i] > 0:
            out.append(_points(i, ordered, lo, hi, burst))
        lo = hi
    return tuple(out)


def _rebinned(
    ordered: list[int],
    hist: tuple[float, ...],
    burst: int,
    before: tuple[Bin, ...],
    moved: list[int],
    changed: set[int],
) -> tuple[Bin, ...]:
    """`before`'s bins, but for those `changed` and those the `moved` gaps change: their own, and those beside
    them whose spread they are read for (within a bin on either side: `spread`'s `near`)."""
    by_index = {b.index: b for b in before}
    if by_index and (len(hist) < GAP_BINS or min(map(hist.__getitem__, by_index)) <= 0):  # a weight decayed to none
        changed |= {b.index for b in before if b.index >= len(hist) or hist[b.index] <= 0}
    for g in moved:
        i = _bin(g)
        changed.add(i)
        for b in (by_index.get(i - 1), by_index.get(i + 1)):
            if b is not None and UPPER[b.index] > burst and b.low / SQRT2 <= g <= b.high * SQRT2:
                changed.add(b.index)
    if not changed:
        return before
    n = len(ordered)
    for i in changed:
        by_index.pop(i, None)
        lo = bisect_left(ordered, LOWER[i]) if i else 0
        hi = bisect_left(ordered, UPPER[i], lo) if i < GAP_BINS - 1 else n
        if hi > lo and i < len(hist) and hist[i] > 0:
            by_index[i] = _points(i, ordered, lo, hi, burst)
    return tuple(by_index[i] for i in sorted(by_index))


def _points(i: int, ordered: list[int], lo: int, hi: int, burst: int) -> Bin:
    """Bin i's points: its gaps `ordered[lo:hi]`, each spread (from `burst` on) by the factors `spread` says."""
    alike = Counter(ordered[lo:hi])  # equal gaps (a lull is among the gaps too) make one point
    values, counts = list(alike), list(alike.values())
    if UPPER[i] <= burst:  # a busy function's short gaps, where they were
        return Bin(i, hi - lo, 1, ordered[lo], ordered[hi - 1], tuple(map(float, values)), tuple(counts))
    factors = spread(ordered, lo, hi)
    xs = list(chain.from_iterable(map(f.__mul__, values) for f in factors))
    ks = counts * len(factors)
    order = sorted(range(len(xs)), key=xs.__getitem__)
    x, k = list(map(xs.__getitem__, order)), list(map(ks.__getitem__, order))
    if any(map(eq, x, islice(x, 1, None))):  # two gaps' points at the same place: one point
        x, k = _alike(x, k)
    return Bin(i, hi - lo, len(factors), ordered[lo], ordered[hi - 1], tuple(x), tuple(k))


def _alike(x: list[float], k: list[int]) -> tuple[list[float], list[int]]:
    xs, ks = x[:1], k[:1]
    for value, count in zip(x[1:], k[1:], strict=True):
        if value == xs[-1]:
            ks[-1] += count
        else:
            xs.append(value)
            ks.append(count)
    return xs, ks


def _moved(before: tuple[int, ...], after: tuple[int, ...]) -> list[int] | None:
    """The gaps that came into a ring or left it, when `after` is `before` with up to MOVED_AT_MOST gaps added (and
    as many of the oldest dropped, once full), newest first; None when it is not."""
    if after is before or after == before:
        return []
    if not after or len(after) < len(before):
        return None
    for added in range(max(1, len(after) - len(before)), min(MOVED_AT_MOST, len(after)) + 1):
        kept = after[: len(after) - added]
        if kept == before[len(before) - len(kept) :]:
            return [*reversed(after[len(after) - added :]), *before[: len(before) - len(kept)]]
    return None


def _bin(gap: int) -> int:
    """The bin a gap is counted in: bin 0 holds everything below its upper edge, the last everything above."""
    i = min(GAP_BINS - 1, max(0, int(2 * math.log2(max(gap, 1)))))
    while i and gap < LOWER[i]:
        i -= 1
    while i < GAP_BINS - 1 and gap >= UPPER[i]:
        i += 1
    return i
