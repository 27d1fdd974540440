"""SPES (Lee et al., ICDE 2024): classify each function by its idle bins, and pre-load or unload by class.

A function's history is the runs of quiet bins between its active ones (`FnStats.quiet_bins`, bins of
`features.ACTIVITY_BIN_MS`). The paper's bin is a minute, on two weeks of Azure's per-minute counts;
our traces run 11 s to 5 h, with starts of 0.1-15 s, so the bin here is 10 s: the smallest round bin
whose two-bin pre-warm lead (20 s) covers a start on every trace, and 360 bins in an hour.

Classes, tried in this order on the recent quiet runs (at least MIN_SAMPLES of them):
- always warm: nearly every bin active (DOMINANT of the runs are 0): never unloaded;
- regular: one dominant run length (DOMINANT of them within a bin of the mode);
- dense: DOMINANT of them shorter than DENSE_BINS (what its keep-alive covers), with no dominant one;
- approximately regular: longer runs, of up to three lengths (modes) that cover DOMINANT of them;
- unknown (the paper's pulsed, correlated and possible need what our protocol lacks: other functions'
  co-occurrence, days of history): the provider default, a 10-minute keep-alive, as for new functions.

A regular function's next call is predicted in the bin after its last active one plus the median run,
give or take min(std, 2 bins); an approximately regular one's in a window per mode. An instance is
pre-warmed when a predicted window starts within 2 bins, and held through the window. An instance
idle is unloaded after 1 idle bin (regular classes) or DENSE_BINS (dense). A miss starts one instance
per waiting request, as every peer does.
"""

import enum
import math
from dataclasses import dataclass

from scaler.controller.core.features import ACTIVITY_BIN_MS, FnStats
from scaler.controller.core.policy.base import NO_PREWARM, KeepAlive, Policy, Prewarm
from scaler.controller.core.policy.estimate import median
from scaler.controller.core.state import FnState, Instance

BIN_MS = ACTIVITY_BIN_MS
MIN_SAMPLES = 4  # quiet runs needed to classify a function
DOMINANT = 0.8  # the share of runs a class's pattern must explain
MAX_MODES = 3  # approximately regular: up to three run lengths
DENSE_BINS = 5  # dense: idle runs mostly shorter than this; its instances are kept this many idle bins
REGULAR_IDLE_BINS = 1  # regular classes: unloaded after one idle bin
PREWARM_LEAD_BINS = 2  # pre-warm when a predicted window starts within two bins
MAX_SPREAD_BINS = 2  # a window reaches min(std, 2 bins) either side of its prediction
UNKNOWN_KEEP_MS = 10 * 60_000  # unknown and new functions: the provider default keep-alive
ALWAYS_WARM_RECHECK_MS = BIN_MS  # an always-warm instance's keep-alive is renewed while the class holds


class Kind(enum.StrEnum):
    ALWAYS_WARM = "always warm"
    REGULAR = "regular"
    APPROX_REGULAR = "approximately regular"
    DENSE = "dense"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Window:
    """A predicted arrival window, in ms (absolute): [start_ms, end_ms)."""

    start_ms: int
    end_ms: int


def modes(runs: tuple[int, ...]) -> list[tuple[int, list[int]]]:
    """Run lengths by how many runs lie within a bin of them, the most common first; each run counted once."""
    left, out = list(runs), []
    while left:
        mode = max(sorted(set(left)), key=lambda v: sum(abs(r - v) <= 1 for r in left))
        near = [r for r in left if abs(r - mode) <= 1]
        out.append((mode, near))
        left = [r for r in left if abs(r - mode) > 1]
    return out


def classify(runs: tuple[int, ...]) -> Kind:
    if len(runs) < MIN_SAMPLES:
        return Kind.UNKNOWN
    n = len(runs)
    if sum(r == 0 for r in runs) >= DOMINANT * n:
        return Kind.ALWAYS_WARM
    found = modes(runs)
    if len(found[0][1]) >= DOMINANT * n:
        return Kind.REGULAR
    if sum(r < DENSE_BINS for r in runs) >= DOMINANT * n:
        return Kind.DENSE
    if sum(len(near) for _, near in found[:MAX_MODES]) >= DOMINANT * n:
        return Kind.APPROX_REGULAR
    return Kind.UNKNOWN


def _std(values: list[int]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def windows(s: FnState, f: FnStats, kind: Kind) -> list[Window]:
    """The predicted windows of the next call: one per mode (regular: the median run, std of all runs)."""
    runs = f.quiet_bins
    last_bin = f.last_arrival_ms // BIN_MS
    if kind is Kind.REGULAR:
        predicted = [(median(list(runs)), _std(list(runs)))]
    elif kind is Kind.APPROX_REGULAR:
        predicted = [(median(near), _std(near)) for _, near in modes(runs)[:MAX_MODES]]
    else:
        return []
    out = []
    for run, std in predicted:
        spread = min(std, MAX_SPREAD_BINS)
        at = last_bin + 1 + run  # the bin the next call is predicted in
        out.append(Window(int((at - spread) * BIN_MS), int((at + 1 + spread) * BIN_MS)))
    return sorted(out, key=lambda w: w.start_ms)


@dataclass(frozen=True)
class Spes(Policy):
    name: str = "spes"

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        kind = classify(f.quiet_bins)
        ahead = not inst.for_request and not inst.request_id
        if ahead and f.last_arrival_ms < inst.wanted_ms:  # pre-warmed, its call still to come
            ends = [w.end_ms for w in windows(s, f, kind) if w.end_ms > now]
            if ends:
                return KeepAlive(min(ends), f"SPES {kind}: pre-warmed, held through the predicted window")
        return self.expire(s, f, inst, now) or KeepAlive(now, f"SPES {kind}: unload")

    def expire(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive | None:
        kind = classify(f.quiet_bins)
        idle_from = max(inst.since_ms, f.last_arrival_ms)
        match kind:
            case Kind.ALWAYS_WARM:
                return KeepAlive(now + ALWAYS_WARM_RECHECK_MS, "SPES always warm: never unloaded")
            case Kind.REGULAR | Kind.APPROX_REGULAR:
                until, why = (idle_from // BIN_MS + 1 + REGULAR_IDLE_BINS) * BIN_MS, "unload after 1 idle bin"
            case Kind.DENSE:
                until, why = (idle_from // BIN_MS + 1 + DENSE_BINS) * BIN_MS, f"unload after {DENSE_BINS} idle bins"
            case _:
                until, why = idle_from + UNKNOWN_KEEP_MS, "10-minute keep-alive"
        return KeepAlive(until, f"SPES {kind}: {why}") if until > now else None

    def prewarm(self, s: FnState, f: FnStats, now: int) -> Prewarm:
        if not s.nothing_live() or not f.arrivals:
            return NO_PREWARM
        kind = classify(f.quiet_bins)
        lead = PREWARM_LEAD_BINS * BIN_MS
        for w in windows(s, f, kind):
            if now >= w.end_ms:
                continue
            if now < w.start_ms - lead:
                return Prewarm(next_ms=w.start_ms - lead)
            if not any(i.wanted_ms >= w.start_ms - lead for i in s.instances.values()):
                return Prewarm(1, f"SPES {kind}: a predicted window starts within {PREWARM_LEAD_BINS} bins")
        return NO_PREWARM
