"""The adaptive keep-alive of the challenge's public solutions (self-reported 52.9 online).

Per function, an idle instance is destroyed once its idle time exceeds
clamp(log2(ms since the last Assign) x 10 x D/Q, 75 s, 230 s), D the median inter-arrival
and Q the median execution time (a threshold that grows as the function stays quiet). On a
miss it waits briefly for a busy instance instead of cold-starting, when that instance's
expected remaining run (Q minus what it already ran) is shorter than an instance's start.
"""

import math
from typing import Annotated

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import UNSEEN, KeepAlive, Policy, PolicyConfig, QueuePlan, RunView
from scaler.controller.core.policy.estimate import expected_frees, median, start_ms
from scaler.controller.core.state import FnState, Instance


class AdaptiveConfig(PolicyConfig, frozen=True, kw_only=True):
    min_ms: Annotated[int, msgspec.Meta(description="the shortest keep-alive, ms")] = 75_000
    max_ms: Annotated[int, msgspec.Meta(description="the longest keep-alive, ms")] = 230_000


class PublicAdaptive(Policy):
    name = "public-adaptive"
    Config = AdaptiveConfig
    config: AdaptiveConfig

    def threshold_ms(self, s: FnState, f: FnStats, at: int) -> float:
        low, high = self.config.min_ms, self.config.max_ms
        d, q = median(f.gaps), median(f.runs)
        if not d or not q:
            return low
        since = max(at - f.last_arrival_ms, 1)
        return min(max(math.log2(since) * 10 * d / q * 1000, low), high)

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        # The threshold grows with time since the last Assign: find when idle time first exceeds it.
        until = now + self.config.min_ms
        for _ in range(8):
            nxt = now + self.threshold_ms(s, f, until)
            if abs(nxt - until) < 100:  # the original checked every 100 ms
                break
            until = nxt
        return KeepAlive(int(until), f"adaptive keep-alive {(until - now) / 1000:.0f}s (D/Q threshold)")

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int, run: RunView = UNSEEN) -> QueuePlan:
        q = median(f.runs)
        if not q or not f.start_ms:
            return QueuePlan(starts=uncovered)
        soon = [end for end in expected_frees(s, f, q, now) if end - now < start_ms(s, f)]
        waiting = min(uncovered, len(soon))
        if not waiting:
            return QueuePlan(starts=uncovered)
        last = soon[waiting - 1]
        return QueuePlan(
            starts=uncovered - waiting,
            why=f"wait for a busy instance: {last - now:.0f} ms left < {start_ms(s, f)} ms start",
            recheck_ms=int(last + max(10, 0.2 * q)),
            expected_ms=int(soon[0]),
        )
