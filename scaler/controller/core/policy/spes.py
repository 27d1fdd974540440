"""SPES (Lee et al., ICDE 2024): classify each function by its idle bins, and pre-load or unload by class.

A function's history is the runs of quiet bins between its active ones (`FnStats.quiet_bins`, bins of
`features.ACTIVITY_BIN_MS`). The paper's bin is a minute, on two weeks of Azure's per-minute counts;
our traces run 11 s to 5 h, with starts of 0.1-15 s, so the bin here is 10 s: the smallest round bin
whose two-bin pre-warm lead (20 s) covers a start on every trace, and 360 bins in an hour.

Classes, tried in this order on the recent quiet runs (at least `min_samples` (4) of them):
- always warm: nearly every bin active (`dominant` (80 %) of the runs are 0): never unloaded;
- regular: one dominant run length (`dominant` (80 %) of them within a bin of the mode);
- dense: `dominant` (80 %) of them shorter than `dense_bins` (5) (what its keep-alive covers), with no
  dominant one;
- approximately regular: longer runs, of up to three lengths (modes) that cover `dominant` (80 %) of them;
- unknown (the paper's pulsed, correlated and possible need what our protocol lacks: other functions'
  co-occurrence, days of history): the provider default, a 10-minute keep-alive, as for new functions.

A regular function's next call is predicted in the bin after its last active one plus the median run,
give or take min(std, 2 bins); an approximately regular one's in a window per mode. An instance is
pre-warmed when a predicted window starts within 2 bins, and held through the window. An instance
idle is unloaded after 1 idle bin (regular classes) or `dense_bins` (5) (dense). A miss starts one
instance per waiting request, as every peer does. The knobs are `SpesConfig`'s.
"""

import enum
import math
from dataclasses import dataclass
from typing import Annotated

import msgspec

from scaler.controller.core.features import ACTIVITY_BIN_MS, FnStats
from scaler.controller.core.policy.base import NO_PREWARM, UNSEEN, KeepAlive, Policy, PolicyConfig, Prewarm, RunView
from scaler.controller.core.policy.estimate import median
from scaler.controller.core.state import FnState, Instance

BIN_MS = ACTIVITY_BIN_MS  # the quiet bins' width (FnStats.quiet_bins)
ALWAYS_WARM_RECHECK_MS = BIN_MS  # an always-warm instance's keep-alive is renewed while the class holds


class SpesConfig(PolicyConfig, frozen=True, kw_only=True):
    min_samples: Annotated[int, msgspec.Meta(description="quiet runs needed to classify a function")] = 4
    dominant: Annotated[float, msgspec.Meta(description="the share of runs a class's pattern must explain")] = 0.8
    max_modes: Annotated[int, msgspec.Meta(description="approximately regular: up to this many run lengths")] = 3
    dense_bins: Annotated[
        int,
        msgspec.Meta(description="dense: idle runs mostly shorter than this; its instances kept this many idle bins"),
    ] = 5
    regular_idle_bins: Annotated[
        int, msgspec.Meta(description="regular classes: unloaded after this many idle bins")
    ] = 1
    prewarm_lead_bins: Annotated[
        int, msgspec.Meta(description="pre-warm when a predicted window starts within this many bins")
    ] = 2
    max_spread_bins: Annotated[
        int, msgspec.Meta(description="a window reaches min(std, this many bins) either side of its prediction")
    ] = 2
    unknown_keep_ms: Annotated[
        int, msgspec.Meta(description="unknown and new functions: the provider default keep-alive, ms")
    ] = 10 * 60_000


DEFAULT = SpesConfig()


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


def classify(runs: tuple[int, ...], c: SpesConfig = DEFAULT) -> Kind:
    if len(runs) < c.min_samples:
        return Kind.UNKNOWN
    n = len(runs)
    if sum(r == 0 for r in runs) >= c.dominant * n:
        return Kind.ALWAYS_WARM
    found = modes(runs)
    if len(found[0][1]) >= c.dominant * n:
        return Kind.REGULAR
    if sum(r < c.dense_bins for r in runs) >= c.dominant * n:
        return Kind.DENSE
    if sum(len(near) for _, near in found[: c.max_modes]) >= c.dominant * n:
        return Kind.APPROX_REGULAR
    return Kind.UNKNOWN


def _std(values: list[int]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def windows(s: FnState, f: FnStats, kind: Kind, c: SpesConfig = DEFAULT) -> list[Window]:
    """The predicted windows of the next call: one per mode (regular: the median run, std of all runs)."""
    runs = f.quiet_bins
    last_bin = f.last_arrival_ms // BIN_MS
    if kind is Kind.REGULAR:
        predicted = [(median(list(runs)), _std(list(runs)))]
    elif kind is Kind.APPROX_REGULAR:
        predicted = [(median(near), _std(near)) for _, near in modes(runs)[: c.max_modes]]
    else:
        return []
    out = []
    for run, std in predicted:
        spread = min(std, c.max_spread_bins)
        at = last_bin + 1 + run  # the bin the next call is predicted in
        out.append(Window(int((at - spread) * BIN_MS), int((at + 1 + spread) * BIN_MS)))
    return sorted(out, key=lambda w: w.start_ms)


class Spes(Policy):
    name = "spes"
    Config = SpesConfig
    config: SpesConfig

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        kind = classify(f.quiet_bins, self.config)
        ahead = not inst.for_request and not inst.request_id
        if ahead and f.last_arrival_ms < inst.wanted_ms:  # pre-warmed, its call still to come
            ends = [w.end_ms for w in windows(s, f, kind, self.config) if w.end_ms > now]
            if ends:
                return KeepAlive(min(ends), f"SPES {kind}: pre-warmed, held through the predicted window")
        return self.expire(s, f, inst, now) or KeepAlive(now, f"SPES {kind}: unload")

    def expire(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive | None:
        c = self.config
        kind = classify(f.quiet_bins, c)
        idle_from = max(inst.since_ms, f.last_arrival_ms)
        match kind:
            case Kind.ALWAYS_WARM:
                return KeepAlive(now + ALWAYS_WARM_RECHECK_MS, "SPES always warm: never unloaded")
            case Kind.REGULAR | Kind.APPROX_REGULAR:
                idle = c.regular_idle_bins
                until = (idle_from // BIN_MS + 1 + idle) * BIN_MS
                why = f"unload after {idle} idle bin" + ("s" if idle != 1 else "")
            case Kind.DENSE:
                until, why = (idle_from // BIN_MS + 1 + c.dense_bins) * BIN_MS, f"unload after {c.dense_bins} idle bins"
            case _:
                until, why = idle_from + c.unknown_keep_ms, f"{c.unknown_keep_ms / 60_000:g}-minute keep-alive"
        return KeepAlive(until, f"SPES {kind}: {why}") if until > now else None

    def prewarm(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Prewarm:
        c = self.config
        if not s.nothing_live() or not f.arrivals:
            return NO_PREWARM
        kind = classify(f.quiet_bins, c)
        lead = c.prewarm_lead_bins * BIN_MS
        for w in windows(s, f, kind, c):
            if now >= w.end_ms:
                continue
            if now < w.start_ms - lead:
                return Prewarm(next_ms=w.start_ms - lead)
            if not any(i.wanted_ms >= w.start_ms - lead for i in s.instances.values()):
                return Prewarm(1, f"SPES {kind}: a predicted window starts within {c.prewarm_lead_bins} bins")
        return NO_PREWARM
