"""A decision stated as a whole value: given a function's commands, when one more comes, then this `Decision`.

    given(assign("r1")).when(ready(), at=10).then(events=[...], replies=[...], wake_ms=...)

`then` compares the whole `Decision` the core returned, its state included: the state expected is the one
the expected events make of the state before (as `Decision.state` must be `replay(before, events)`). On a
difference it says which part differs, one event or reply a line, as a diff.
"""

import difflib
from collections.abc import Sequence
from typing import NamedTuple

from scaler.controller.core.decide import Decision, decide
from scaler.controller.core.limits import NO_ROOM, Room
from scaler.controller.core.policy import Policy
from scaler.controller.core.state import FnState, replay
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.core.factories import DEMO, KEY


class Decided(NamedTuple):
    """What the core decided on `before`."""

    before: FnState
    decision: Decision

    @property
    def state(self) -> FnState:
        return self.decision.state

    def then(
        self, events: Sequence[e.Event] = (), replies: Sequence[c.Reply] = (), wake_ms: int | None = None
    ) -> Decision:
        """The decision is these events, replies and wake-up, and the state they make: returns it."""
        expected = Decision(list(events), list(replies), replay(self.before, list(events)), wake_ms)
        if self.decision != expected:
            raise AssertionError(_difference(expected, self.decision))
        return self.decision


class Given(NamedTuple):
    """A function's state after its history, and what it is decided with: the policy and the room it has."""

    state: FnState
    policy: Policy
    room: Room

    def when(self, cmd: c.Command, at: int, policy: Policy | None = None) -> Decided:
        return Decided(self.state, decide(self.state, cmd, at, policy or self.policy, room=self.room))


def given(
    *history: c.Command,
    at: int = 0,
    step: int = 10,
    policy: Policy = DEMO,
    room: Room = NO_ROOM,
    s: FnState | None = None,
) -> Given:
    """The state after `history`, decided `step` ms apart from `at` (on `s`, or a new function's state)."""
    s = s or FnState(key=KEY)
    for n, cmd in enumerate(history):
        d = decide(s, cmd, at + n * step, policy, room=room)
        assert replay(s, d.events) == d.state, "Decision.state must equal the replayed events"
        s = d.state
    return Given(s, policy, room)


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
    if not said:  # the same events, replies and wake-up: the state is not what they make
        said = f"the state is not the events replayed:\n  expected {expected.state!r}\n  decided  {got.state!r}"
    return "the decision differs:\n" + said
