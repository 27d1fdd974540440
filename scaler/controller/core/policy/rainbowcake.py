"""RainbowCake (Yu et al., ASPLOS 2024), its function-level policy as its released ContainerPool.scala has it.

Per function, the last `history` arrivals (6) within a day; their mean gap m is (now - the oldest) / their
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
from typing import Annotated

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import NO_PREWARM, UNSEEN, KeepAlive, Policy, PolicyConfig, Prewarm, RunView
from scaler.controller.core.policy.estimate import start_ms
from scaler.controller.core.state import FnState, Instance, Phase


class RainbowCakeConfig(PolicyConfig, frozen=True, kw_only=True):
    history: Annotated[int, msgspec.Meta(description="arrivals remembered")] = 6
    history_ms: Annotated[int, msgspec.Meta(description="... within this long, ms")] = 24 * 3_600_000
    quantile: Annotated[
        float, msgspec.Meta(description="the quantile of the exponential gap pre-warm and keep-alive are set at")
    ] = 0.8
    alpha: Annotated[
        float, msgspec.Meta(description="weight of the start saved against the memory held (1 - alpha)")
    ] = 0.996
    alive_min_s: Annotated[int, msgspec.Meta(description="the shortest keep-alive, s")] = 60
    alive_max_s: Annotated[int, msgspec.Meta(description="the longest keep-alive, s")] = 600
    prewarm_min_s: Annotated[int, msgspec.Meta(description="the pre-warm delay with no gap to go by, s")] = 1

    @property
    def means(self) -> float:
        """The quantile, in means of the exponential: 1.609 for 0.8."""
        return -math.log(1 - self.quantile)


DEFAULT = RainbowCakeConfig()


def arrivals(s: FnState, f: FnStats, c: RainbowCakeConfig = DEFAULT) -> list[int]:
    """The last `history` arrivals (ms), oldest first, from the last one and the gaps before it."""
    st = f
    if not st.arrivals:
        return []
    out = [st.last_arrival_ms]
    for gap in reversed(st.gaps[-(c.history - 1) :]):
        out.append(out[-1] - gap)
    return out[::-1]


def mean_gap_s(s: FnState, f: FnStats, at: int, c: RainbowCakeConfig = DEFAULT) -> float:
    """RainbowCake's mean inter-arrival at `at`: (at - the oldest arrival kept) / arrivals kept, in seconds."""
    kept = [t for t in arrivals(s, f, c) if at - t < c.history_ms]
    return (at - kept[0]) / 1000 / len(kept) if kept else 0.0


def bound_s(s: FnState, f: FnStats, c: RainbowCakeConfig = DEFAULT) -> int:
    """UB: the keep-alive whose memory costs what a start costs, at most `alive_max_s`."""
    memory = s.meta.memory_mb if s.meta else 0
    if not f.start_ms or not memory:
        return c.alive_max_s
    return min(c.alive_max_s, math.ceil(c.alpha * f.start_ms / 1000 / ((1 - c.alpha) * memory)))


def alive_s(s: FnState, f: FnStats, at: int, c: RainbowCakeConfig = DEFAULT) -> int:
    mean = mean_gap_s(s, f, at, c)
    upper = bound_s(s, f, c)
    if mean <= 0:
        return upper
    alive = math.ceil(c.means * mean)
    return c.alive_min_s if alive < c.alive_min_s else min(alive, upper)


class RainbowCake(Policy):
    name = "rainbowcake"
    Config = RainbowCakeConfig
    config: RainbowCakeConfig

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        keep = alive_s(s, f, now, self.config)
        return KeepAlive(now + keep * 1000, f"RainbowCake keep-alive {keep}s (1.61 x mean gap, 60 s..UB)")

    def prewarm(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Prewarm:
        c = self.config
        if not f.arrivals:
            return NO_PREWARM
        last = f.last_arrival_ms
        mean = mean_gap_s(s, f, last, c)
        due = last + (math.ceil(c.means * mean) if mean > 0 else c.prewarm_min_s) * 1000
        if now < due:
            return Prewarm(next_ms=due)
        if s.queue or any(i.phase in (Phase.IDLE, Phase.CREATING) for i in s.instances.values()):
            return NO_PREWARM
        if any(i.wanted_ms >= due for i in s.instances.values()):
            return NO_PREWARM  # pre-warmed for this arrival already
        if now >= due + max(start_ms(s, f), 1_000):
            return NO_PREWARM  # the event fired at `due`; a later look is not it
        return Prewarm(1, "RainbowCake pre-warm: 1.61 x mean gap after the last arrival, none idle")
