"""RainbowCake (Yu et al., ASPLOS 2024), its function-level policy as its released ContainerPool.scala has it.

Per function, the last HISTORY arrivals within a day; their mean gap m is (now - the oldest) / their
number, taken at each arrival, and arrivals are taken as exponential with that mean:
- pre-warm: an instance is started 1.61 m after each arrival (the exponential's 80 % quantile,
  -m ln 0.2), when none of the function's instances is idle then;
- keep-alive: ceil(1.61 m) s, raised to 60 s when below, else cut to the cost bound when above it:
  UB = ceil(0.996 start_s / (0.004 memory_MB)) s, the keep-alive past which the memory held costs
  more than the start it saves, at most 600 s (the code's order: the 60 s floor first).
The released pool pre-warms when an idle instance exists (`if (current > 0)`), where its comment and
the paper say when none is; this follows the paper. Its layer sharing (a bare or language container
kept for any function) has no counterpart in our protocol, whose slots belong to one function.
"""

import math
from dataclasses import dataclass

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import NO_PREWARM, KeepAlive, Policy, Prewarm
from scaler.controller.core.policy.estimate import start_ms
from scaler.controller.core.state import FnState, Instance, Phase

HISTORY = 6  # arrivals remembered
HISTORY_MS = 24 * 3_600_000  # ... within a day
QUANTILE = -math.log(1 - 0.8)  # the exponential's 80 % quantile, in means: 1.609
ALPHA = 0.996  # weight of the start saved against the memory held (1 - ALPHA)
ALIVE_MIN_S, ALIVE_MAX_S = 60, 600
PREWARM_MIN_S = 1  # the pre-warm delay with no gap to go by


def arrivals(s: FnState, f: FnStats) -> list[int]:
    """The last HISTORY arrivals (ms), oldest first, from the last one and the gaps before it."""
    st = f
    if not st.arrivals:
        return []
    out = [st.last_arrival_ms]
    for gap in reversed(st.gaps[-(HISTORY - 1) :]):
        out.append(out[-1] - gap)
    return out[::-1]


def mean_gap_s(s: FnState, f: FnStats, at: int) -> float:
    """RainbowCake's mean inter-arrival at `at`: (at - the oldest arrival kept) / arrivals kept, in seconds."""
    kept = [t for t in arrivals(s, f) if at - t < HISTORY_MS]
    return (at - kept[0]) / 1000 / len(kept) if kept else 0.0


def bound_s(s: FnState, f: FnStats) -> int:
    """UB: the keep-alive whose memory costs what a start costs, at most ALIVE_MAX_S."""
    memory = s.meta.memory_mb if s.meta else 0
    if not f.start_ms or not memory:
        return ALIVE_MAX_S
    return min(ALIVE_MAX_S, math.ceil(ALPHA * f.start_ms / 1000 / ((1 - ALPHA) * memory)))


def alive_s(s: FnState, f: FnStats, at: int) -> int:
    mean = mean_gap_s(s, f, at)
    upper = bound_s(s, f)
    if mean <= 0:
        return upper
    alive = math.ceil(QUANTILE * mean)
    return ALIVE_MIN_S if alive < ALIVE_MIN_S else min(alive, upper)


@dataclass(frozen=True)
class RainbowCake(Policy):
    name: str = "rainbowcake"

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        keep = alive_s(s, f, now)
        return KeepAlive(now + keep * 1000, f"RainbowCake keep-alive {keep}s (1.61 x mean gap, 60 s..UB)")

    def prewarm(self, s: FnState, f: FnStats, now: int) -> Prewarm:
        if not f.arrivals:
            return NO_PREWARM
        last = f.last_arrival_ms
        mean = mean_gap_s(s, f, last)
        due = last + (math.ceil(QUANTILE * mean) if mean > 0 else PREWARM_MIN_S) * 1000
        if now < due:
            return Prewarm(next_ms=due)
        if s.queue or any(i.phase in (Phase.IDLE, Phase.CREATING) for i in s.instances.values()):
            return NO_PREWARM
        if any(i.wanted_ms >= due for i in s.instances.values()):
            return NO_PREWARM  # pre-warmed for this arrival already
        if now >= due + max(start_ms(s, f), 1_000):
            return NO_PREWARM  # the event fired at `due`; a later look is not it
        return Prewarm(1, "RainbowCake pre-warm: 1.61 x mean gap after the last arrival, none idle")
