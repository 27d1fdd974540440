"""The folded stream: every function's state, where its last batch is, when it next wakes, the run's totals,
and which functions follow which.

Written once and used by everything that folds EVENTS or turns decisions into batches: the node,
`scaler replay`, the offline simulator and the tests. So "offline equals live" and "replay equals
the running state" rest on this one piece of code, not on copies kept in sync. Pure like the core
(no I/O, no clock: time and sequences come in), but a container that changes in place: it holds
the latest immutable state of each function.
"""

from scaler.controller.core.decide import Decision, decide
from scaler.controller.core.limits import NO_LIMITS, NO_ROOM, Room
from scaler.controller.core.policy import Policy
from scaler.controller.core.state import FnState, Totals, apply, newest_returns
from scaler.proto.commands import AnyCommand, Cue, Tick, command_id
from scaler.proto.events import Batch, RequestArrived

NO_TOTALS = Totals()


def came_back(d: Decision) -> int:
    """When the decision's call brought its function back from a lull (FnStats.returned_ms); 0 when it did not."""
    back = d.state.stats.returned_ms
    return back if back and any(isinstance(e, RequestArrived) and e.at_ms == back for e in d.events) else 0


class Ledger:
    def __init__(self) -> None:
        self.states: dict[str, FnState] = {}
        self.last_seq: dict[str, int] = {}  # per function: stream sequence of its last batch
        self.wake: dict[str, int] = {}  # per function: when it next wants a Tick
        self.totals = Totals()  # the run so far, summed over these functions
        self.others = Totals()  # ... and over the functions other nodes hold, as they last said
        self.limits = NO_LIMITS  # the operator's caps, those over all functions scaled to this ledger's share
        self.seq = 0  # the newest stream sequence folded or appended
        self.followers: dict[str, set[str]] = {}  # a function -> those that follow it (FnStats.leaders)
        self.heard: tuple[tuple[str, int], ...] = ()  # other nodes' functions that came back lately (`hear`)

    def state(self, key: str) -> FnState:
        return self.states.get(key) or FnState(key=key)

    def fold(self, seq: int, batch: Batch) -> None:
        """Fold a stored batch, unless the function's state already holds it (a snapshot's, or a repeat)."""
        self.seq = max(self.seq, seq)
        if seq <= self.last_seq.get(batch.key, 0):
            return
        s = self.state(batch.key)
        for event in batch.events:
            s = apply(s, event)
        self._put(batch.key, s, seq)
        self._wake(batch.key, batch.wake_ms)

    def decide(self, cmd: AnyCommand, now: int, policy: Policy, after: Decision | None = None) -> Decision:
        """The core's decision, with the whole run's totals (the policy's exchange rate is taken from them).

        `after`: a decision on the same function just taken and not yet committed (a group commit decides
        each command on the state the one before it left, and with the totals that state makes).
        """
        s, totals = self.state(cmd.key), self.totals
        if after is not None:
            s, totals = after.state, totals.change(self.states.get(cmd.key), after.state)
        room = Room.of(self.limits, cmd.key, totals) if self.limits is not NO_LIMITS else NO_ROOM
        return decide(s, cmd, now, policy, self.run_totals(totals), room)

    def run_totals(self, totals: Totals | None = None) -> Totals:
        totals = self.totals if totals is None else totals
        totals = totals.plus(self.others) if self.others != NO_TOTALS else totals
        return totals.with_returns(self.heard) if self.heard else totals

    @staticmethod
    def batch(cmd: AnyCommand, d: Decision, now: int) -> Batch | None:
        """What a decision appends: its events as one batch, or None when it changed nothing."""
        if not d.events:
            return None
        return Batch(key=cmd.key, at_ms=now, cause=command_id(cmd), events=d.events, wake_ms=d.wake_ms)

    def commit(self, cmd: AnyCommand, d: Decision, seq: int | None) -> None:
        """The decision is done: its batch stored at `seq` (None when it had none to store).

        Its next deadline counts when it changed something or answered a Tick: a Tick that found
        nothing due yet re-arms the timer, while any other decision that changed nothing leaves
        the deadline as it was (the one a restart finds in the last batch).
        """
        if seq is not None:
            self._put(cmd.key, d.state, seq)
            self.seq = max(self.seq, seq)
        if seq is not None or isinstance(cmd, Tick):
            self._wake(cmd.key, d.wake_ms)

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
        self._follow(key, self.states.get(key), None)
        self.totals = self.totals.change(self.states.pop(key, None), None)
        self.last_seq.pop(key, None)
        self.wake.pop(key, None)

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

    def restore(self, states: dict[str, FnState], last_seq: dict[str, int], wake: dict[str, int], seq: int) -> None:
        """Start from a snapshot: these states hold every batch up to `seq`, and each one's up to its last_seq."""
        for key, s in states.items():
            self._put(key, s, last_seq.get(key, 0))
        self.wake.update(wake)
        self.seq = max(self.seq, seq)

    def _put(self, key: str, s: FnState, seq: int) -> None:
        """The function's new state; one that holds nothing (forgotten, or a stray slot's bookkeeping done)
        is dropped, keeping only where its last batch is (the next append's order check needs it)."""
        if seq:
            self.last_seq[key] = seq
        if s.meta is None and not s.instances and not s.queue:
            self._follow(key, self.states.get(key), None)
            self.totals = self.totals.change(self.states.pop(key, None), None)
            return
        self._follow(key, self.states.get(key), s)
        self.totals = self.totals.change(self.states.get(key), s)
        self.states[key] = s

    def _follow(self, key: str, old: FnState | None, new: FnState | None) -> None:
        """Keep `followers` as the functions' leaders say, once one function's state `old` becomes `new`."""
        was = old.stats.leaders if old is not None else ()
        now = new.stats.leaders if new is not None else ()
        if was is now:
            return
        followed, follows = {x.key for x in was if not x.failed()}, {x.key for x in now if not x.failed()}
        for leader in followed - follows:
            self.followers[leader].discard(key)
            if not self.followers[leader]:
                del self.followers[leader]
        for leader in follows - followed:
            self.followers.setdefault(leader, set()).add(key)

    def _wake(self, key: str, wake_ms: int | None) -> None:
        if wake_ms is None:
            self.wake.pop(key, None)
        else:
            self.wake[key] = wake_ms
