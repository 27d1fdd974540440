"""What a policy decides, and the defaults: the challenge's demo scaler."""

from dataclasses import dataclass
from typing import Self

from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState, Instance
from scaler.controller.core.totals import Totals


@dataclass(frozen=True)
class KeepAlive:
    until_ms: int
    why: str


@dataclass(frozen=True)
class QueuePlan:
    """For requests no idle instance or start covers: how many instances to start now.

    Those not started wait for an instance to free up; `recheck_ms` is when to reconsider if
    they still wait (None: only when something else happens). `ahead`: more instances to start now,
    for arrivals expected before those starts are ready (a burst that began with none ready).
    """

    starts: int
    ahead: int = 0
    why: str = "cold start: no idle instance"
    recheck_ms: int | None = None
    expected_ms: int = 0  # when a waiting request is expected to be served


@dataclass(frozen=True)
class Prewarm:
    """Instances to start now with no request waiting, and when the next planned start is due."""

    count: int = 0
    why: str = ""
    next_ms: int | None = None


NO_PREWARM = Prewarm()


class Policy:
    """The choices the core leaves open. Pure: the function's state `s`, its features `f` (what its events say of
    it: scaler/controller/core/features.py, folded beside the state) and `now` in, a choice out.

    The core does the bookkeeping (queueing, matching, replies, expiry); a policy only says
    which idle instance to reuse, how many instances to start for waiting requests (or to let
    them wait), how long an idle instance stays, and when to start instances ahead of demand.
    Every choice comes with a reason, which goes into the events.
    """

    name = "base"
    # Whether an instance started for a waiting request serves that request only (the challenge's
    # Go starter: the Assign that misses creates its own slot and waits for it, while an instance
    # freed meanwhile goes idle for the next arrival); else whoever waits longest takes whatever is
    # ready first.
    dedicated_starts: bool = False
    # Whether it learns which functions a function follows (comes back shortly after) and is cued when they
    # come back (scaler/controller/core/decide.py, "Leaders").
    follows_leaders: bool = False

    def tuned_to(self, totals: Totals) -> Self:
        """This policy with its parameters set from the whole run so far: a new value (most ignore the run)."""
        return self

    def pick(self, s: FnState, f: FnStats, idle: list[Instance], now: int) -> Instance:
        """The idle instance that serves the next waiting request: the most recently idled one."""
        return max(idle, key=lambda i: (i.since_ms, i.id))

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int) -> QueuePlan:
        """`uncovered` requests wait with no idle instance and no start for them: start one each."""
        return QueuePlan(starts=uncovered)

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        """How long an instance that just became idle stays."""
        raise NotImplementedError

    def expire(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive | None:
        """An idle instance reached its deadline: keep it longer (a later deadline), or None to retire it."""
        return None

    def prewarm(self, s: FnState, f: FnStats, now: int) -> Prewarm:
        return NO_PREWARM


@dataclass(frozen=True)
class FixedKeepAlive(Policy):
    """Reuse the most recently idled instance, cold-start on a miss, keep idle ones a fixed time."""

    keep_alive_ms: int = 5 * 60_000
    name: str = "demo"
    dedicated_starts: bool = True

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int) -> KeepAlive:
        return KeepAlive(now + self.keep_alive_ms, f"fixed keep-alive {self.keep_alive_ms / 1000:g}s")
