"""When the early gaps still open began, counted by coarse start time: the censored half of the run's
new-function prior (forecast.new_function_points), in a few kB whatever the number of functions.

Each function within its first EARLY_GAPS arrivals has one gap open, since its last arrival. The prior
only needs each one's age at half-octave precision (the gap bins), so a start is kept as a count in
its block: a second while the function is active, a minute once it has rested (FunctionRested, ten
minutes idle by default), when a minute is within a tenth of its age. The block depends on the
function's state alone, so the counts are a sum over functions: the running node, a replay, a
restored snapshot and the sum of two nodes' counts agree exactly, in any order. Active functions span
a few minutes of seconds; rested ones at most the time before they are forgotten (a day of minutes).
"""

import bisect
from typing import NamedTuple

import msgspec

ACTIVE_MS = 1_000  # an active function's block
RESTED_MS = 60_000  # a rested function's block


class Opened(NamedTuple):
    """Where one open gap is counted: the function has rested or not, and the block of its start."""

    rested: bool
    block: int


class OpenGaps(msgspec.Struct, frozen=True, array_like=True):
    """Open gaps by start: active functions' as sorted seconds with their counts, rested functions' as
    counts of consecutive minutes from `rested_from` (none empty at either end)."""

    active: tuple[int, ...] = ()  # blocks (start // ACTIVE_MS), ascending
    active_n: tuple[int, ...] = ()  # open gaps in each
    rested_from: int = 0  # the first block of `rested_n` (start // RESTED_MS)
    rested_n: tuple[int, ...] = ()

    def __len__(self) -> int:
        return sum(self.active_n) + sum(self.rested_n)

    def add(self, where: Opened, n: int = 1) -> "OpenGaps":
        """One more open gap at `where` (n = -1: one fewer)."""
        if where.rested:
            return self._rested(where.block, n)
        at = bisect.bisect_left(self.active, where.block)
        if at < len(self.active) and self.active[at] == where.block:
            left = self.active_n[at] + n
            if left > 0:
                return msgspec.structs.replace(self, active_n=(*self.active_n[:at], left, *self.active_n[at + 1 :]))
            blocks, counts = self.active[:at] + self.active[at + 1 :], self.active_n[:at] + self.active_n[at + 1 :]
            return msgspec.structs.replace(self, active=blocks, active_n=counts)
        if n <= 0:
            return self
        blocks = (*self.active[:at], where.block, *self.active[at:])
        return msgspec.structs.replace(self, active=blocks, active_n=(*self.active_n[:at], n, *self.active_n[at:]))

    def _rested(self, block: int, n: int) -> "OpenGaps":
        first, counts = self.rested_from, self.rested_n
        at = block - first
        if counts and 0 <= at < len(counts):
            counts = (*counts[:at], max(0, counts[at] + n), *counts[at + 1 :])
        elif n <= 0:
            return self
        elif not counts:
            first, counts = block, (n,)
        elif at < 0:
            first, counts = block, (n, *(0,) * (-at - 1), *counts)
        else:
            counts = (*counts, *(0,) * (at - len(counts)), n)
        lo = next((i for i, c in enumerate(counts) if c), len(counts))
        if lo == len(counts):
            return OpenGaps(self.active, self.active_n)
        hi = len(counts) - next(i for i, c in enumerate(reversed(counts)) if c)
        return OpenGaps(self.active, self.active_n, first + lo, counts[lo:hi])

    def plus(self, other: "OpenGaps") -> "OpenGaps":
        """Both sets of open gaps (two nodes' functions, say)."""
        if not other.active and not other.rested_n:
            return self
        active = dict(zip(self.active, self.active_n, strict=True))
        for block, n in zip(other.active, other.active_n, strict=True):
            active[block] = active.get(block, 0) + n
        blocks = tuple(sorted(active))
        rested_from, rested_n = self.rested_from, self.rested_n
        if not rested_n:
            rested_from, rested_n = other.rested_from, other.rested_n
        elif other.rested_n:
            first = min(self.rested_from, other.rested_from)
            last = max(self.rested_from + len(self.rested_n), other.rested_from + len(other.rested_n))
            counts = [0] * (last - first)
            for start, ns in ((self.rested_from, self.rested_n), (other.rested_from, other.rested_n)):
                for i, n in enumerate(ns):
                    counts[start - first + i] += n
            rested_from, rested_n = first, tuple(counts)
        return OpenGaps(blocks, tuple(active[b] for b in blocks), rested_from, rested_n)

    def ages(self, now: int) -> list[tuple[float, int]]:
        """How long the open gaps have lasted at `now` (from the middle of their block), ascending, with
        how many have; the oldest is known to a minute."""
        out = [(now - (b + 0.5) * ACTIVE_MS, n) for b, n in zip(self.active, self.active_n, strict=True)]
        out += [(now - (self.rested_from + i + 0.5) * RESTED_MS, n) for i, n in enumerate(self.rested_n) if n]
        return sorted((max(age, 0.0), n) for age, n in out)


NO_OPEN_GAPS = OpenGaps()
