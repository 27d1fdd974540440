"""The folded stream: every function's state, where its last batch is, when it next wakes, the run's totals,
and which functions follow which.

Written once and used by everything that folds EVENTS or turns decisions into batches: the node,
`scaler replay`, the offline simulator and the tests. So "offline equals live" and "replay equals
the running state" rest on this one piece of code, not on copies kept in sync. Pure like the core
(no I/O, no clock: time and sequences come in), but a container that changes in place: it holds
the latest immutable state of each function.
"""

import logging
from collections.abc import Callable

import msgspec

from scaler.controller import platform_health
from scaler.controller.core import decide as core
from scaler.controller.core import folds
from scaler.controller.core.decide import Decision
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.limits import NO_LIMITS, NO_ROOM, Limits, Room, TenantQuota
from scaler.controller.core.policy import Policy
from scaler.controller.core.policy.learned import with_rate
from scaler.controller.core.state import FnState
from scaler.controller.core.totals import Totals, newest_returns
from scaler.controller.policies import get_policy
from scaler.proto.commands import AnyCommand, Assign, Cue, Tick, command_id
from scaler.proto.events import Batch, RequestArrived

log = logging.getLogger(__name__)

NO_TOTALS = Totals()
PLAN = "plan"  # the cause of a plan's batch: no command caused it, the function's rest did


def _nothing() -> None:
    pass


def came_back(d: Decision) -> int:
    """When the decision's call brought its function back from a lull (FnStats.returned_ms); 0 when it did not."""
    back = d.features.returned_ms
    return back if back and any(isinstance(e, RequestArrived) and e.at_ms == back for e in d.events) else 0


class Ledger:
    def __init__(self) -> None:
        self.states: dict[str, FnState] = {}
        self.features: dict[str, FnStats] = {}  # per function: what its events say of it, folded beside its state
        self.last_seq: dict[str, int] = {}  # per function: stream sequence of its last batch
        self.wake: dict[str, int] = {}  # per function: when it next wants a Tick (the earlier of the two below)
        self._asked: dict[str, int] = {}  # ... by what its last decisions serve (leases, waiting requests)
        self._planned: dict[str, int] = {}  # ... by its last plan (keep-alives, pre-warms, rest)
        self.totals = Totals()  # the run so far, summed over these functions
        self.tenants_moved: Callable[[], None] = _nothing  # told when what these functions' tenants hold changed
        self.others = Totals()  # ... and over the functions other nodes hold, as they last said
        self.limits = NO_LIMITS  # the operator's caps, those over all functions scaled to this ledger's share
        self.quotas: dict[str, TenantQuota] = {}  # tenants' quotas an operator set while running, over the file's
        self._rated: dict[tuple[Policy, float], Policy] = {}  # policies at a function's own exchange rate
        self._policies: dict[str, Policy] = {}  # the policies functions chose (FnState.policy, the file's), by name
        self._merged: tuple[Limits, dict, Limits] = (NO_LIMITS, {}, NO_LIMITS)  # `_limits`, kept while they hold
        self.seq = 0  # the newest stream sequence folded or appended
        self.followers: dict[str, set[str]] = {}  # a function -> those that follow it (FnStats.leaders)
        self.heard: tuple[tuple[str, int], ...] = ()  # other nodes' functions that came back lately (`hear`)
        self.starts_failing = platform_health.StartsFailing()  # the platform's failed starts, over these functions

    def state(self, key: str) -> FnState:
        return self.states.get(key) or FnState(key=key)

    def features_of(self, key: str) -> FnStats:
        return self.features.get(key, NO_STATS)

    def fold(self, seq: int, batch: Batch) -> None:
        """Fold a stored batch, unless the function's state already holds it (a snapshot's, or a repeat)."""
        self.seq = max(self.seq, seq)
        if seq <= self.last_seq.get(batch.key, 0):
            return
        s, st = folds.replay(self.state(batch.key), self.features_of(batch.key), batch.events)
        self._put(batch.key, s, st, seq)
        self._asked.pop(batch.key, None)  # a stored batch's deadline is the earliest of both
        self._set(self._planned, batch.key, batch.wake_ms)
        self._wake(batch.key)

    def decide(self, cmd: AnyCommand, now: int, policy: Policy, after: Decision | None = None) -> Decision:
        """The core's response to `cmd` (what its caller waits for), with the whole run's totals (the policy's
        exchange rate is taken from them).

        `after`: a decision on the same function just taken and not yet committed (a group commit decides
        each command on the state the one before it left, and with the totals that state makes).
        """
        s, st, totals = self.state(cmd.key), self.features_of(cmd.key), self.totals
        if after is not None:
            s, st = after.state, after.features
            totals = totals.change(self.states.get(cmd.key), s, self.features.get(cmd.key), st)
        named = cmd.tenant if isinstance(cmd, Assign) else ""
        if s.policy or self.limits is not NO_LIMITS:
            policy = self.policy_of(s, policy)
        self.starts_failing.saw(cmd, now)
        return core.respond(s, cmd, now, policy, self.run_totals(totals), self._room(s, totals, named, now), st)

    def plan(self, key: str, now: int, policy: Policy, after: Decision | None = None) -> Decision:
        """The core's plan for the function as stored (or as `after`, a decision not yet committed, left it):
        keep-alives, retirements, pre-warms, rest."""
        s, st, totals = self.state(key), self.features_of(key), self.totals
        if after is not None:
            s, st = after.state, after.features
            totals = totals.change(self.states.get(key), s, self.features.get(key), st)
        if s.policy or self.limits is not NO_LIMITS:
            policy = self.policy_of(s, policy)
        return core.plan(s, now, policy, self.run_totals(totals), self._room(s, totals, now=now), st)

    def policy_of(self, s: FnState, default: Policy) -> Policy:
        """The policy that decides the function: the one an operator set for it, else the limits file's, else
        `default` (the node's)."""
        name = s.policy or self.limits.of(s.key).policy
        if name and name != default.name:
            if (chosen := self._policies.get(name)) is None:
                chosen = self._policies[name] = _loaded_or(name, default)
            default = chosen
        return self._own_rate(s, default)

    def _own_rate(self, s: FnState, policy: Policy) -> Policy:
        """`policy` at the function's own exchange rate, when an operator (`scaler set`) or the limits file sets one
        and the policy has one."""
        rate = self.limits.of(s.key).over(s).exchange_rate
        if rate is None or not hasattr(policy.config, "exchange_rate"):
            return policy
        key = (policy, rate)
        if (own := self._rated.get(key)) is None:
            own = self._rated[key] = with_rate(policy, rate)
        return own

    def _room(self, s: FnState, totals: Totals, named: str = "", now: int = 0) -> Room:
        """The function's room, with until when the platform is failing starts (`StartsFailing`)."""
        room = self._limits_room(s, totals, named)
        if failing := self.starts_failing.until_ms(now):
            room = msgspec.structs.replace(room, starts_failing_until_ms=failing)
        return room

    def _limits_room(self, s: FnState, totals: Totals, named: str = "") -> Room:
        """The function's room: the caps (those over all functions against this node's `totals`), and its tenant's
        quota against what the tenant holds on every node."""
        if self.limits is NO_LIMITS and not self.quotas and s.limits is None and not named and not s.tenant:
            return NO_ROOM
        limits = self._limits()
        tenants = totals.plus(self.others) if (s.tenant or named) and self.others.tenants else totals
        return Room.of(limits, s, totals, tenants, named)

    def _limits(self) -> Limits:
        """The limits file's, with the tenants' quotas an operator set while running over its own."""
        if not self.quotas:
            return self.limits
        if self._merged[0] is not self.limits or self._merged[1] is not self.quotas:
            tenants = {**self.limits.tenants, **self.quotas}
            self._merged = (self.limits, self.quotas, msgspec.structs.replace(self.limits, tenants=tenants))
        return self._merged[2]

    def tenants(self) -> dict[str, TenantQuota]:
        """Every tenant's quota: the limits file's, and those an operator set while running over them."""
        return self._limits().tenants

    def run_totals(self, totals: Totals | None = None) -> Totals:
        totals = self.totals if totals is None else totals
        totals = totals.plus(self.others) if self.others != NO_TOTALS else totals
        return totals.with_returns(self.heard) if self.heard else totals

    def batch(self, cmd: AnyCommand | None, d: Decision, now: int, after: Decision | None = None) -> Batch | None:
        """What a decision appends (a plan's when `cmd` is None, made after the decision `after` when it is not yet
        committed): its events as one batch, or None when it changed nothing. Its deadline is the function's next
        one once it is stored."""
        if not d.events:
            return None
        key = d.state.key
        if cmd is None:
            wake = _earliest(self._asked.get(key) if after is None else after.wake_ms, d.wake_ms)
        else:
            wake = _earliest(d.wake_ms, self._planned.get(key))
        cause = PLAN if cmd is None else command_id(cmd)
        return Batch(key=key, at_ms=now, cause=cause, events=d.events, wake_ms=wake)

    def commit(self, cmd: AnyCommand, d: Decision, seq: int | None) -> None:
        """The decision is done: its batch stored at `seq` (None when it had none to store).

        Its deadlines count when it changed something or answered a Tick: a Tick that found
        nothing due yet re-arms the timer, while any other decision that changed nothing leaves
        the deadline as it was (the one a restart finds in the last batch).
        """
        if seq is not None:
            self._put(cmd.key, d.state, d.features, seq)
            self.seq = max(self.seq, seq)
        if seq is not None or isinstance(cmd, Tick):
            self._set(self._asked, cmd.key, d.wake_ms)
            self._wake(cmd.key)

    def commit_plan(self, key: str, d: Decision, seq: int | None) -> None:
        """The plan is done: its batch stored at `seq` (None when it had nothing to store); its deadlines count."""
        if seq is not None:
            self._put(key, d.state, d.features, seq)
            self.seq = max(self.seq, seq)
        self._set(self._planned, key, d.wake_ms)
        self._wake(key)

    def cues(self, d: Decision) -> list[Cue]:
        """When the decision brought its function back from a lull: a Cue for each function here that follows
        it and has no instance now (one with an instance needs no pre-warm)."""
        back = came_back(d)
        return self._cues(d.state.key, back) if back else []

    def hear(self, leader: str, at_ms: int) -> list[Cue]:
        """Another node's function came back from a lull at `at_ms`: one of this node's coming back soon after
        may follow it (the run's returns count it at once, not when that node next shares its totals), and
        those that follow it already are cued."""
        self.heard = newest_returns([*self.heard, (leader, at_ms)])
        return self._cues(leader, at_ms)

    def _cues(self, leader: str, at_ms: int) -> list[Cue]:
        quiet = [f for f in sorted(self.followers.get(leader, ())) if (s := self.states.get(f)) and s.nothing_live()]
        return [Cue(key=f, leader=leader, at_ms=at_ms) for f in quiet]

    def forget(self, key: str) -> None:
        """Drop one function, to fold it again from its own batches (after another writer's append)."""
        self._drop(key)
        self.last_seq.pop(key, None)
        for deadlines in (self.wake, self._asked, self._planned):
            deadlines.pop(key, None)

    def expire(self, key: str, seq: int) -> None:
        """Retention dropped the function's batches after `seq` (all of them when 0): its state holds them
        still, and its next append expects `seq` as the last one stored."""
        if seq:
            self.last_seq[key] = seq
        else:
            self.last_seq.pop(key, None)

    def expire_before(self, first_seq: int) -> None:
        """The stream now begins at `first_seq`: functions whose last batch is older have none left in it.
        Their next append expects none, and a forgotten one leaves nothing behind at all."""
        gone = [key for key, seq in self.last_seq.items() if seq < first_seq]
        for key in gone:
            del self.last_seq[key]

    def restore(
        self,
        states: dict[str, FnState],
        features: dict[str, FnStats],
        last_seq: dict[str, int],
        wake: dict[str, int],
        seq: int,
    ) -> None:
        """Start from a snapshot: these states (and features) hold every batch up to `seq`, and each one's up to its
        last_seq."""
        for key, s in states.items():
            self._put(key, s, features.get(key, NO_STATS), last_seq.get(key, 0))
        self.wake.update(wake)
        self._planned.update(wake)
        self.seq = max(self.seq, seq)

    def _put(self, key: str, s: FnState, st: FnStats, seq: int) -> None:
        """The function's new state and features; one that holds nothing (forgotten, or a stray slot's bookkeeping
        done) is dropped, keeping only where its last batch is (the next append's order check needs it)."""
        if seq:
            self.last_seq[key] = seq
        if s.meta is None and not s.instances and not s.queue and not s.configured():
            self._drop(key)
            return
        self._follow(key, self.features.get(key), st)
        self._count(self.totals.change(self.states.get(key), s, self.features.get(key), st))
        self.states[key] = s
        if st is NO_STATS:
            self.features.pop(key, None)
        else:
            self.features[key] = st

    def _drop(self, key: str) -> None:
        """The function holds nothing any more: its state and features go, and what they counted."""
        was = self.features.pop(key, None)
        self._follow(key, was, None)
        self._count(self.totals.change(self.states.pop(key, None), None, was))

    def _count(self, totals: Totals) -> None:
        moved = totals.tenants is not self.totals.tenants
        self.totals = totals
        if moved:  # the other nodes count them against the tenant's quota (shared.py)
            self.tenants_moved()

    def _follow(self, key: str, old: FnStats | None, new: FnStats | None) -> None:
        """Keep `followers` as the functions' leaders say, once one function's features `old` become `new`."""
        was = old.leaders if old is not None else ()
        now = new.leaders if new is not None else ()
        if was is now:
            return
        followed, follows = {x.key for x in was if not x.failed()}, {x.key for x in now if not x.failed()}
        for leader in followed - follows:
            self.followers[leader].discard(key)
            if not self.followers[leader]:
                del self.followers[leader]
        for leader in follows - followed:
            self.followers.setdefault(leader, set()).add(key)

    @staticmethod
    def _set(deadlines: dict[str, int], key: str, wake_ms: int | None) -> None:
        if wake_ms is None:
            deadlines.pop(key, None)
        else:
            deadlines[key] = wake_ms

    def _wake(self, key: str) -> None:
        self._set(self.wake, key, _earliest(self._asked.get(key), self._planned.get(key)))


def _earliest(*wakes: int | None) -> int | None:
    return min((w for w in wakes if w is not None), default=None)


def _loaded_or(name: str, default: Policy) -> Policy:
    """The policy `name`, or the node's own when this node cannot import it (an outside policy set on a node that
    has its module, taken over by one that does not): said once, as the function must still be served."""
    try:
        return get_policy(name)
    except ValueError as e:
        log.warning("%s; its functions are decided by this node's policy %s instead", e, default.name)
        return default
