"""What a live scaler decided, checked against the pure core: a check that holds however fast the machine is.

Live, when a request reaches the controller depends on the machine (a loaded one serves it later,
an instance looks busy for longer), so live figures drift from offline ones. What must not drift
is the decision on what the controller saw: every batch it appended is the core's decision on the
state the stream held before it, with the run's totals as they were. `Decisions` records what the
controller decided (its command, time, state and totals) and `check` holds the EVENTS stream
against it, deciding each batch again with a fresh policy.
"""

from collections import defaultdict
from typing import NamedTuple

import pytest

from scaler.controller.core import decide as core
from scaler.controller.core import folds
from scaler.controller.core.decide import Decision
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.limits import NO_ROOM, Room
from scaler.controller.core.policy import get_policy
from scaler.controller.core.state import FnState
from scaler.controller.core.totals import Totals
from scaler.controller.ledger import PLAN
from scaler.proto.commands import AnyCommand, command_id
from scaler.proto.events import Batch
from scaler.runtime.bus import connected
from scaler.store import stream


class Taken(NamedTuple):
    state: FnState
    cmd: AnyCommand | None  # None: a plan
    now: int
    totals: Totals | None
    room: Room
    decision: Decision
    features: FnStats = NO_STATS  # the function's features it was decided with


class Decisions:
    """Every decision the controller in this process takes (through its ledger), by function and cause: each
    command's response, and each plan."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken: dict[tuple[str, str], list[Taken]] = defaultdict(list)
        self.features: dict[str, FnStats] = {}  # by function, as `check` replayed them
        respond, plan = core.respond, core.plan

        def responding(
            s: FnState, cmd: AnyCommand, now: int, policy, totals: Totals | None = None, room=NO_ROOM, features=NO_STATS
        ):
            d = respond(s, cmd, now, policy, totals, room, features)
            self.taken[cmd.key, command_id(cmd)].append(Taken(s, cmd, now, totals, room, d, features))
            return d

        def planning(s: FnState, now: int, policy, totals: Totals | None = None, room=NO_ROOM, features=NO_STATS):
            d = plan(s, now, policy, totals, room, features)
            self.taken[s.key, PLAN].append(Taken(s, None, now, totals, room, d, features))
            return d

        monkeypatch.setattr(core, "respond", responding)
        monkeypatch.setattr(core, "plan", planning)

    async def check(self, nats_url: str, policy: str) -> dict[str, FnState]:
        """Every appended batch is the core's decision on the stream's state (and features); returns the states
        replayed (their features in `self.features`)."""
        batches: list[tuple[int, Batch]] = []
        async with connected(nats_url, "decisions") as nc:
            await stream.read(nc.jetstream(), lambda seq, batch: batches.append((seq, batch)))
        assert batches, "nothing was decided"
        states: dict[str, FnState] = {}
        learned = self.features
        for seq, stored in batches:
            for batch in stored.decisions():  # several when decided in a row and stored together
                before = states.get(batch.key) or FnState(key=batch.key)
                f = learned.get(batch.key, NO_STATS)
                taken = [
                    t
                    for t in self.taken[batch.key, batch.cause]
                    if t.state == before and t.features == f and t.decision.events == batch.events
                ]
                assert taken, f"seq {seq} ({batch.cause}) is not the controller's decision on the state before it"
                t = taken[-1]
                fresh = get_policy(policy)
                if t.cmd is None:
                    again = core.plan(before, t.now, fresh, t.totals, t.room, f)
                else:
                    again = core.respond(before, t.cmd, t.now, fresh, t.totals, t.room, f)
                assert (again.events, again.wake_ms) == (batch.events, t.decision.wake_ms), f"seq {seq} ({batch.cause})"
                assert batch.wake_ms is None or batch.wake_ms <= (t.decision.wake_ms or batch.wake_ms)
                states[batch.key], learned[batch.key] = folds.replay(before, f, batch.events)
        return states
