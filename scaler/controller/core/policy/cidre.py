"""CIDRE (Liu et al., ASPLOS 2025; its released src/lambda/lambdaFunction.go): delayed warm starts.

A request that finds no idle instance queues for a busy one (a delayed warm start) and, on the cold
path, starts a new instance at once: whichever is free first serves it, the other goes idle for the
next request. This is the core's own race: starts are not dedicated (no `Capability.DEDICATED_STARTS`), so
a waiting request takes the first instance ready, freed or new. The cold path is on while 0.8 x the
mean queueing time of the last `window` requests exceeds their mean execution time (the released
code's trigger, `trigNum * queuingMs.Avg > execMs.Avg`); off, the request only queues. A request's
queueing time is the time it waited for an instance that existed when it came (`FnStats.queued`): one
served by an instance started for it waited for a start, not in the queue. With no busy instance
there is nothing to queue for, and an instance starts.

CIDRE evicts idle instances by a concurrency-aware greedy-dual priority when memory runs out; our
protocol has no memory cap, so that eviction would never run. The rest is a fixed keep-alive of 10
minutes, OpenWhisk's default, which `fixed10` uses too: what sets `cidre` apart from it is CIDRE's
own contribution, the queueing, alone.
"""

from typing import Annotated

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import UNSEEN, KeepAlive, Policy, PolicyConfig, QueuePlan, RunView
from scaler.controller.core.policy.estimate import expected_frees
from scaler.controller.core.state import FnState, Instance, Phase


class CidreConfig(PolicyConfig, frozen=True, kw_only=True):
    window: Annotated[int, msgspec.Meta(description="requests the rolling means of queueing and execution cover")] = 10
    trigger: Annotated[
        float, msgspec.Meta(description="the cold path is on while trigger x mean queueing > mean execution")
    ] = 0.8
    keep_alive_ms: Annotated[int, msgspec.Meta(description="how long an idle instance stays, ms")] = 10 * 60_000


DEFAULT = CidreConfig()


def _mean(values: tuple[int, ...], window: int) -> float:
    recent = values[-window:]
    return sum(recent) / len(recent) if recent else 0.0


def cold_path(s: FnState, f: FnStats, c: CidreConfig = DEFAULT) -> bool:
    """Whether waiting requests also start an instance: recent queueing outweighs recent execution."""
    return c.trigger * _mean(f.queued, c.window) > _mean(f.runs, c.window)


class Cidre(Policy):
    name = "cidre"
    Config = CidreConfig
    config: CidreConfig

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        keep = self.config.keep_alive_ms
        return KeepAlive(now + keep, f"CIDRE: no memory cap to evict under, {keep / 60_000:g}-minute keep-alive")

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int, run: RunView = UNSEEN) -> QueuePlan:
        c = self.config
        busy = s.in_phase(Phase.BUSY)
        if not busy:
            return QueuePlan(starts=uncovered, why="cold start: no idle or busy instance")
        queued, runs = _mean(f.queued, c.window), _mean(f.runs, c.window)
        if cold_path(s, f, c):
            why = "queue for a busy instance and start one, first free serves"
            why += f" ({c.trigger:g} x {queued:.0f} > {runs:.0f} ms)"
            return QueuePlan(starts=uncovered, why=why)
        frees = expected_frees(s, f, runs, now)
        return QueuePlan(
            starts=0,
            why=f"delayed warm start: queue for a busy instance ({c.trigger:g} x {queued:.0f} <= {runs:.0f} ms run)",
            expected_ms=int(frees[0]) if frees else 0,
        )
