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

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import NO_PREWARM, KeepAlive, Policy, Prewarm
from scaler.controller.core.state import FnState, Instance, Phase

MINUTE = 60_000
LONG_KEEP_ALIVE_MS = 4 * 60 * MINUTE
MIN_SAMPLES = 10
MIN_CV = 2.0


@dataclass(frozen=True)
class Windows:
    prewarm_ms: int  # after the end of an execution: when to load again (0: never unload)
    keep_ms: int  # after the end of an execution: when to unload


def windows(s: FnState, f: FnStats) -> Windows | None:
    """The pre-warm and keep-alive windows, or None when the histogram is not representative."""
    hist = f.idle_hist
    total = sum(hist)
    if total < MIN_SAMPLES or f.idle_oob * 2 >= total + f.idle_oob:
        return None
    mean = total / len(hist)
    cv = (sum((c - mean) ** 2 for c in hist) / len(hist)) ** 0.5 / mean
    if cv < MIN_CV:
        return None
    head = _percentile_bin(hist, total, 0.05) * MINUTE  # lower edge of the 5th percentile's bin
    tail = (_percentile_bin(hist, total, 0.99) + 1) * MINUTE  # upper edge of the 99th's
    return Windows(prewarm_ms=int(0.9 * head), keep_ms=int(1.1 * tail))


def _percentile_bin(hist: tuple[int, ...], total: int, q: float) -> int:
    seen = 0
    for minute, count in enumerate(hist):
        seen += count
        if seen >= q * total:
            return minute
    return len(hist) - 1


@dataclass(frozen=True)
class HybridHistogram(Policy):
    name: str = "histogram"

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        w = windows(s, f)
        if w is None:
            return KeepAlive(now + LONG_KEEP_ALIVE_MS, "histogram not representative: 4 h keep-alive")
        if not inst.request_id:  # a pre-warmed instance: keep until the window closes
            return KeepAlive(max(now, f.last_end_ms + w.keep_ms), "pre-warmed: keep until 1.1 x p99 idle")
        if w.prewarm_ms == 0:
            return KeepAlive(now + w.keep_ms, f"p5 idle < 1 min: keep {w.keep_ms / 1000:g}s (1.1 x p99)")
        return KeepAlive(now, f"unload; reload at {w.prewarm_ms / 1000:g}s (0.9 x p5 idle)")

    def prewarm(self, s: FnState, f: FnStats, now: int) -> Prewarm:
        w = windows(s, f)
        if w is None or w.prewarm_ms == 0 or s.queue or s.instances or not f.last_end_ms:
            return NO_PREWARM
        due, until = f.last_end_ms + w.prewarm_ms, f.last_end_ms + w.keep_ms
        if now < due:
            return Prewarm(next_ms=due)
        if now < until and not any(i.phase is not Phase.RETIRING for i in s.instances.values()):
            return Prewarm(1, f"histogram pre-warm: 0.9 x p5 idle = {w.prewarm_ms / 1000:g}s after the last end")
        return NO_PREWARM
