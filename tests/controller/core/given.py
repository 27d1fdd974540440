"""A decision stated as a whole value: given a function's commands, when one more comes, then this `Decision`.

    given(assign("r1")).when(ready(), at=10).then(events=[...], replies=[...], wake_ms=...)

`then` compares the whole `Decision` the core returned, its state and features included: those expected are the
ones the expected events make of the state and features before (as `Decision.state` must be `replay(before,
events)`). On a difference it says which part differs, one event or reply a line, as a diff.
"""

import difflib
from collections.abc import Sequence
from typing import NamedTuple

from scaler.controller.core import folds
from scaler.controller.core.decide import Decision, decide
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.limits import NO_ROOM, Room
from scaler.controller.core.policy import Policy
from scaler.controller.core.state import FnState
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY


class Decided(NamedTuple):
    """What the core decided on `before`."""

    before: FnState
    decision: Decision
    learned: FnStats = NO_STATS  # the function's features before

    @property
    def state(self) -> FnState:
        return self.decision.state

    @property
    def features(self) -> FnStats:
        return self.decision.features

    def then(
        self, events: Sequence[e.Event] = (), replies: Sequence[c.Reply] = (), wake_ms: int | None = None
    ) -> Decision:
        """The decision is these events, replies and wake-up, and the state they make: returns it."""
        s, f = folds.replay(self.before, self.learned, list(events))
        expected = Decision(list(events), list(replies), s, wake_ms, f)
        if self.decision != expected:
            raise AssertionError(_difference(expected, self.decision))
        return self.decision


class Given(NamedTuple):
    """A function's state after its history, and what it is decided with: the policy and the room it has."""

    state: FnState
    policy: Policy
    room: Room
    features: FnStats = NO_STATS

    def when(self, cmd: c.Command, at: int, policy: Policy | None = None) -> Decided:
        d = decide(self.state, cmd, at, policy or self.policy, room=self.room, features=self.features)
        return Decided(self.state, d, self.features)


def given(
    *history: c.Command,
    at: int = 0,
    step: int = 10,
    policy: Policy = DEMO,
    room: Room = NO_ROOM,
    s: "FnState | Decision | Decided | Given | None" = None,
    f: FnStats = NO_STATS,
) -> Given:
    """The state (and features) after `history`, decided `step` ms apart from `at` (on `s` and its features `f`, or
    a new function's). `s` may be what an earlier `given`, `when` or `then` left: its state and features both."""
    if s is not None and not isinstance(s, FnState):
        s, f = s.state, s.features
    s = s or FnState(key=KEY)
    for n, cmd in enumerate(history):
        d = decide(s, cmd, at + n * step, policy, room=room, features=f)
        assert folds.replay(s, f, d.events) == (d.state, d.features), "Decision.state must equal the replayed events"
        s, f = d.state, d.features
    return Given(s, policy, room, f)


def _lines(d: Decision) -> list[str]:
    return [
        "events:",
        *(f"  {ev!r}" for ev in d.events),
        "replies:",
        *(f"  {r!r}" for r in d.replies),
        f"wake_ms: {d.wake_ms}",
    ]


def _difference(expected: Decision, got: Decision) -> str:
    diff = difflib.unified_diff(_lines(expected), _lines(got), "expected", "decided", lineterm="", n=20)
    said = "\n".join(diff)
    if not said and expected.state != got.state:  # the same events, replies and wake-up: not the state they make
        said = f"the state is not the events replayed:\n  expected {expected.state!r}\n  decided  {got.state!r}"
    elif not said:
        said = f"the features are not the events folded:\n  expected {expected.features!r}\n  decided  {got.features!r}"
    return "the decision differs:\n" + said
