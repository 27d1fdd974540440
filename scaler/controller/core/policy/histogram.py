"""The hybrid histogram policy of "Serverless in the Wild" (Shahrad et al., USENIX ATC 2020).

Per function, a histogram of idle times (end of an execution with nothing left in flight, to
the next invocation), 1-minute bins over 4 hours. When it is representative (enough samples and
the bin counts' coefficient of variation >= 2), the head (5th percentile) and the tail (99th)
set a pre-warm window and a keep-alive window: unload right after the execution, load again at
end + 0.9 x head, keep until end + 1.1 x tail (head 0: don't unload, keep until the tail).
Otherwise a long fixed keep-alive (4 hours, the paper's setting). The paper forecasts functions
whose idle times mostly exceed 4 hours with ARIMA; none of our traces has such idle times in
numbers, so those get the long keep-alive too.
"""

from dataclasses import dataclass
from typing import Annotated

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import NO_PREWARM, UNSEEN, KeepAlive, Policy, PolicyConfig, Prewarm, RunView
from scaler.controller.core.state import FnState, Instance, Phase

MINUTE = 60_000  # the histogram's bin (FnStats.idle_hist)


class HistogramConfig(PolicyConfig, frozen=True, kw_only=True):
    long_keep_alive_ms: Annotated[
        int, msgspec.Meta(description="keep-alive while the histogram is not representative, ms")
    ] = 4 * 60 * MINUTE
    min_samples: Annotated[int, msgspec.Meta(description="idle times the histogram needs to be representative")] = 10
    min_cv: Annotated[
        float, msgspec.Meta(description="coefficient of variation of the bin counts it needs to be representative")
    ] = 2.0
    head: Annotated[float, msgspec.Meta(description="the percentile of idle times that sets the pre-warm")] = 0.05
    tail: Annotated[float, msgspec.Meta(description="the percentile of idle times that sets the keep-alive")] = 0.99
    prewarm_margin: Annotated[float, msgspec.Meta(description="pre-warm at this x the head")] = 0.9
    keep_margin: Annotated[float, msgspec.Meta(description="keep until this x the tail")] = 1.1


DEFAULT = HistogramConfig()


@dataclass(frozen=True)
class Windows:
    prewarm_ms: int  # after the end of an execution: when to load again (0: never unload)
    keep_ms: int  # after the end of an execution: when to unload


def windows(s: FnState, f: FnStats, c: HistogramConfig = DEFAULT) -> Windows | None:
    """The pre-warm and keep-alive windows, or None when the histogram is not representative."""
    hist = f.idle_hist
    total = sum(hist)
    if total < c.min_samples or f.idle_oob * 2 >= total + f.idle_oob:
        return None
    mean = total / len(hist)
    cv = (sum((c - mean) ** 2 for c in hist) / len(hist)) ** 0.5 / mean
    if cv < c.min_cv:
        return None
    head = _percentile_bin(hist, total, c.head) * MINUTE  # lower edge of the head percentile's bin
    tail = (_percentile_bin(hist, total, c.tail) + 1) * MINUTE  # upper edge of the tail's
    return Windows(prewarm_ms=int(c.prewarm_margin * head), keep_ms=int(c.keep_margin * tail))


def _percentile_bin(hist: tuple[int, ...], total: int, q: float) -> int:
    seen = 0
    for minute, count in enumerate(hist):
        seen += count
        if seen >= q * total:
            return minute
    return len(hist) - 1


class HybridHistogram(Policy):
    name = "histogram"
    Config = HistogramConfig
    config: HistogramConfig

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        c, w = self.config, windows(s, f, self.config)
        head, tail = f"{c.prewarm_margin:g} x p{c.head * 100:g} idle", f"{c.keep_margin:g} x p{c.tail * 100:g}"
        if w is None:
            keep = self.config.long_keep_alive_ms
            return KeepAlive(now + keep, f"histogram not representative: {keep / 3_600_000:g} h keep-alive")
        if not inst.request_id:  # a pre-warmed instance: keep until the window closes
            return KeepAlive(max(now, f.last_end_ms + w.keep_ms), f"pre-warmed: keep until {tail} idle")
        if w.prewarm_ms == 0:
            return KeepAlive(now + w.keep_ms, f"p{c.head * 100:g} idle < 1 min: keep {w.keep_ms / 1000:g}s ({tail})")
        return KeepAlive(now, f"unload; reload at {w.prewarm_ms / 1000:g}s ({head})")

    def prewarm(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Prewarm:
        c, w = self.config, windows(s, f, self.config)
        if w is None or w.prewarm_ms == 0 or s.queue or s.instances or not f.last_end_ms:
            return NO_PREWARM
        due, until = f.last_end_ms + w.prewarm_ms, f.last_end_ms + w.keep_ms
        if now < due:
            return Prewarm(next_ms=due)
        if now < until and not any(i.phase is not Phase.RETIRING for i in s.instances.values()):
            return Prewarm(
                1,
                f"histogram pre-warm: {c.prewarm_margin:g} x p{c.head * 100:g} idle"
                f" = {w.prewarm_ms / 1000:g}s after the last end",
            )
        return NO_PREWARM
