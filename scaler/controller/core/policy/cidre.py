"""CIDRE (Liu et al., ASPLOS 2025; its released src/lambda/lambdaFunction.go): delayed warm starts.

A request that finds no idle instance queues for a busy one (a delayed warm start) and, on the cold
path, starts a new instance at once: whichever is free first serves it, the other goes idle for the
next request. This is the core's own race: starts are not dedicated (`Policy.dedicated_starts`), so
a waiting request takes the first instance ready, freed or new. The cold path is on while 0.8 x the
mean queueing time of the last WINDOW requests exceeds their mean execution time (the released
code's trigger, `trigNum * queuingMs.Avg > execMs.Avg`); off, the request only queues. A request's
queueing time is the time it waited for an instance that existed when it came (`FnStats.queued`): one
served by an instance started for it waited for a start, not in the queue. With no busy instance
there is nothing to queue for, and an instance starts.

CIDRE evicts idle instances by a concurrency-aware greedy-dual priority when memory runs out; our
protocol has no memory cap, so that eviction would never run. The rest is a fixed keep-alive of 10
minutes, OpenWhisk's default, which `fixed10` uses too: what sets `cidre` apart from it is CIDRE's
own contribution, the queueing, alone.
"""

from dataclasses import dataclass

from scaler.controller.core.features import FnStats
from scaler.controller.core.policy.base import KeepAlive, Policy, QueuePlan
from scaler.controller.core.policy.estimate import expected_frees
from scaler.controller.core.state import FnState, Instance, Phase

WINDOW = 10  # requests the rolling means cover
TRIGGER = 0.8  # the cold path is on while TRIGGER x mean queueing > mean execution
KEEP_ALIVE_MS = 10 * 60_000


def _mean(values: tuple[int, ...]) -> float:
    recent = values[-WINDOW:]
    return sum(recent) / len(recent) if recent else 0.0


def cold_path(s: FnState, f: FnStats) -> bool:
    """Whether waiting requests also start an instance: recent queueing outweighs recent execution."""
    return TRIGGER * _mean(f.queued) > _mean(f.runs)


@dataclass(frozen=True)
class Cidre(Policy):
    name: str = "cidre"

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        return KeepAlive(now + KEEP_ALIVE_MS, "CIDRE: no memory cap to evict under, 10-minute keep-alive")

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int) -> QueuePlan:
        busy = s.in_phase(Phase.BUSY)
        if not busy:
            return QueuePlan(starts=uncovered, why="cold start: no idle or busy instance")
        queued, runs = _mean(f.queued), _mean(f.runs)
        if cold_path(s, f):
            why = f"queue for a busy instance and start one, first free serves (0.8 x {queued:.0f} > {runs:.0f} ms)"
            return QueuePlan(starts=uncovered, why=why)
        frees = expected_frees(s, f, runs, now)
        return QueuePlan(
            starts=0,
            why=f"delayed warm start: queue for a busy instance (0.8 x {queued:.0f} <= {runs:.0f} ms run)",
            expected_ms=int(frees[0]) if frees else 0,
        )
