"""The adaptive keep-alive of the challenge's public solutions (self-reported 52.9 online).

Per function, an idle instance is destroyed once its idle time exceeds
clamp(log2(ms since the last Assign) x 10 x D/Q, 75 s, 230 s), D the median inter-arrival
and Q the median execution time (a threshold that grows as the function stays quiet). On a
miss it waits briefly for a busy instance instead of cold-starting, when that instance's
expected remaining run (Q minus what it already ran) is shorter than an instance's start.
"""

import math
from dataclasses import dataclass

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import KeepAlive, Policy, QueuePlan
from scaler.controller.core.policy.estimate import expected_frees, median, start_ms
from scaler.controller.core.state import FnState, Instance

MIN_MS, MAX_MS = 75_000, 230_000


@dataclass(frozen=True)
class PublicAdaptive(Policy):
    name: str = "public-adaptive"

    def threshold_ms(self, s: FnState, f: FnStats, at: int) -> float:
        d, q = median(f.gaps), median(f.runs)
        if not d or not q:
            return MIN_MS
        since = max(at - f.last_arrival_ms, 1)
        return min(max(math.log2(since) * 10 * d / q * 1000, MIN_MS), MAX_MS)

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        # The threshold grows with time since the last Assign: find when idle time first exceeds it.
        until = now + MIN_MS
        for _ in range(8):
            nxt = now + self.threshold_ms(s, f, until)
            if abs(nxt - until) < 100:  # the original checked every 100 ms
                break
            until = nxt
        return KeepAlive(int(until), f"adaptive keep-alive {(until - now) / 1000:.0f}s (D/Q threshold)")

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int) -> QueuePlan:
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
