"""A lane: one function's commands, decided in arrival order and stored as one batch, and what that committed.

A group of commands that queued while the function's previous append was in flight is decided in
order, each on the state the one before left, and appended as one batch (one message, one ack). Only
the command's own response is decided here (core `respond`): what its caller waits for. An Idle's
release is answered as soon as it is decided, while its batch is on its way: nothing is handed out on
it before that batch is stored (an Assign given the freed instance is answered once its own batch,
appended after, is). The plan that brings the function to rest is decided after the replies, once for
all the commands that queued (`plan`), and stored as its own batch.

A lane returns what it committed instead of acting on it: the replies to send, cues to give, the
decisions for the leaders' bookkeeping; the lanes that run it (lanes.py) deliver them.
"""

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scaler.controller.core.decide import Decision
from scaler.controller.core.policy import Policy
from scaler.controller.core.state import Phase
from scaler.controller.ledger import Ledger
from scaler.controller.path.writer import Writer
from scaler.controller.snapshotter import Snapshotter
from scaler.proto.commands import (
    AnyCommand,
    Assign,
    Cue,
    Idle,
    Reply,
    SlotCreated,
    SlotDestroyed,
    SlotFailed,
    SlotReady,
)
from scaler.proto.events import Batch, encode_batch, join
from scaler.proto.subjects import partition
from scaler.runtime.bus import Unavailable
from scaler.runtime.clock import Clock
from scaler.store import Conflict, TooBig

log = logging.getLogger("scaler.controller")

APPEND_ATTEMPTS = 3  # conflicts in a row before a command is refused
STEP_ROOM = 32  # bytes a decision's step adds to a batch holding several, beside its cause
# Deciding holds the event loop: past this much of the thread's CPU, the rest of a group waits for the next one.
# gRPC's server reads one new call every few turns of the loop, and leases are renewed on it: turns of half a
# second (groups of hundreds, each decision slow on a busy machine) leave a burst unread for tens of seconds and
# let the node's leases lapse.
DECIDE_BUDGET_S = 0.02


@dataclass
class Committed:
    """What a group committed: one outcome per command taken, in order (a prefix of the group: those past
    the message's size are left for the next group), and what follows from them."""

    outcomes: list[Decision | Exception] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)  # to send now that the batch is stored
    cues: list[Cue] = field(default_factory=list)  # followers on this node of a function that came back
    planned: bool = False  # the function's plan rode in the same batch

    @property
    def decided(self) -> list[Decision]:
        return [o for o in self.outcomes if isinstance(o, Decision)]


class Lane:
    """Decides and stores a function's commands; one for all functions (their state is the ledger's)."""

    def __init__(
        self,
        ledger: Ledger,
        writer: Writer,
        policy: Policy,
        clock: Clock,
        fence: Callable[[int], None],
        snapshots: Snapshotter,
        send: Callable[[list[Reply]], Awaitable[None]],
    ) -> None:
        self.ledger = ledger
        self.writer = writer
        self.policy = policy
        self.clock = clock
        self.fence = fence  # refuses (NotServing) a partition not served here or past its lease's renewal deadline
        self.snapshots = snapshots
        self.send = send  # the early replies go out through it, before the batch is stored

    async def commit(self, key: str, cmds: list[AnyCommand], told: set[str]) -> Committed:
        """Decide the commands in order and append their batches as one.

        An outcome per command taken: its decision, stored; or TooBig when its decision alone is more than
        a message holds (it is not stored; the next command is decided as if it never came). A conflict
        folds the other writer's batches and decides the group again. Raises NotServing, Unavailable or
        StoreLost when nothing of the group could be stored: the reply subjects answered early are then in
        `told` (their releases are to be stored all the same)."""
        p = partition(key)
        looked = checked = False
        out = Committed()
        for _ in range(APPEND_ATTEMPTS):
            out.replies += await self._settle(key)
            if not looked and self._unseen(key, cmds):
                looked = True
                await self.writer.catch_up(key)
            self.fence(p)  # nothing decided or answered past the lease's renewal deadline
            epoch, after = self.writer.epoch(key), self.ledger.last_seq.get(key, 0)
            outcomes, batches, decided, size = self._decide(key, cmds)
            if not batches and not checked and (self.snapshots.suspects_loss() or any(map(_unsure, cmds))):
                checked = True
                if await self._caught_up(key):  # the stream held more of the function: decide on it
                    continue
            taken = zip(cmds, outcomes, strict=False)  # the outcomes of those taken, a prefix of the group
            if not self.snapshots.suspects_loss():  # else answered once stored: the append's order check says
                early = [r for c, o in taken if _releases(c) for r in _own(c, o) if r.to not in told]
                told.update(r.to for r in early)
                await self.send(early)
            planned = self._plan_along(key, cmds, decided, batches, size)
            batch = join(batches) if batches else None
            try:
                try:
                    seq = await self.writer.append(batch, after, epoch) if batch is not None else None
                except TooBig:
                    if planned is None:
                        raise
                    planned, batch = None, join(batches[:-1]) if planned.events else batch  # the plan on its own
                    seq = await self.writer.append(batch, after, epoch) if batch is not None else None
            except Conflict:
                log.warning("conflict on %s: catching up and deciding again", key)
                await self.writer.catch_up(key)
                # What the folded batches assigned was never told: another writer's, or our own whose answer was
                # lost (stored while NATS stood still, then tried again), whose decision taken again here is a
                # no-op that answers nobody.
                out.replies += self.assignments(key)
                continue
            if batch is not None:
                self.snapshots.appended(p, len(batch.events))
            if batch is not None and self.writer.epoch(key) != epoch:  # given up while on its way: stored, answered,
                self.writer.stored_unseen(batch, after, epoch)  # and settled as a doubt should it be written again
            else:
                for cmd, decision, stored in decided:
                    self.ledger.commit(cmd, decision, seq if stored else None)
                if planned is not None:
                    self.ledger.commit_plan(key, planned, seq if planned.events else None)
            out.planned = planned is not None
            out.outcomes = outcomes
            out.replies += [r for d in out.decided for r in d.replies if r.to not in told]
            out.cues = [c for d in out.decided for c in self.ledger.cues(d)]
            return out
        raise Unavailable(f"{APPEND_ATTEMPTS} conflicts in a row on {key!r}")

    async def plan(self, key: str) -> None:
        """Bring the function to rest as stored (keep-alives, retirements, pre-warms) and store the plan."""
        for _ in range(APPEND_ATTEMPTS):
            await self._settle(key)
            self.fence(partition(key))
            now = self.clock.now_ms()
            epoch, after = self.writer.epoch(key), self.ledger.last_seq.get(key, 0)
            planned = self.ledger.plan(key, now, self.policy)
            batch = self.ledger.batch(None, planned, now)
            try:
                seq = await self.writer.append(batch, after, epoch) if batch is not None else None
            except Conflict:
                await self.writer.catch_up(key)
                continue
            if batch is not None:
                self.snapshots.appended(partition(key), len(batch.events))
            if batch is not None and self.writer.epoch(key) != epoch:
                self.writer.stored_unseen(batch, after, epoch)
            else:
                self.ledger.commit_plan(key, planned, seq)
            return
        raise Unavailable(f"{APPEND_ATTEMPTS} conflicts in a row on {key!r}")

    def _plan_along(
        self, key: str, cmds: list[AnyCommand], decided: list, batches: list[Batch], size: int
    ) -> Decision | None:
        """The function's plan after the group's decisions, its batch added to theirs, when no caller of the group
        waits for the group's storage (an Idle's is answered already): one append for both, where a plan of its
        own would be a second append, and the function's next Assign could wait behind it. Not for a group with
        an Assign, whose answer the plan's decision would delay: that plan follows the reply (Lanes._plan)."""
        if not decided or any(isinstance(c, Assign) for c in cmds):
            return None
        now, last = self.clock.now_ms(), decided[-1][1]
        planned = self.ledger.plan(key, now, self.policy, last)
        batch = self.ledger.batch(None, planned, now, last)
        if batch is not None:
            if size and size + len(encode_batch(batch)) + len(batch.cause) + STEP_ROOM > self.writer.store.room:
                return None  # stored on its own, after the replies
            batches.append(batch)
        return planned

    def _decide(self, key: str, cmds: list[AnyCommand]):
        """Each command's decision on the state the one before left, the batches they append (those that would take
        the message past NATS's payload limit, or come after DECIDE_BUDGET_S of deciding, are left for the next
        group), and their size when it was measured."""
        room = self.writer.store.room
        outcomes: list[Decision | Exception] = []
        decided: list[tuple[AnyCommand, Decision, bool]] = []
        batches: list[Batch] = []
        size, last, began = 0, None, time.thread_time()
        for cmd in cmds:
            if outcomes and time.thread_time() - began > DECIDE_BUDGET_S:
                break
            now = self.clock.now_ms()
            decision = self.ledger.decide(cmd, now, self.policy, last)
            batch = self.ledger.batch(cmd, decision, now)
            # Alone, the append itself says when it is too big; but not for a release, answered before its append.
            if batch is not None and (len(cmds) > 1 or _releases(cmd)):
                alone = len(encode_batch(batch))
                try:
                    self.writer.store.fits(alone)
                except TooBig as e:  # refused on its own; the next command is decided as if it never came
                    outcomes.append(e)
                    continue
                n = alone + len(batch.cause) + STEP_ROOM  # what it adds to a batch of several
                if batches and size + n > room:
                    break
                size += n
            if batch is not None:
                batches.append(batch)
            decided.append((cmd, decision, batch is not None))
            outcomes.append(decision)
            last = decision
        return outcomes, batches, decided, size

    def _unseen(self, key: str, cmds: list[AnyCommand]) -> bool:
        """Whether an Idle names an instance numbered past every one this node's state of the function started.

        Its answer would be NOT_FOUND, decided without an append, so no order check would catch a state
        behind the stream (a partition loaded from a server still applying what it had stored, another
        writer's batch): the stream is read first. An id made up by the caller costs that read, then is
        NOT_FOUND all the same."""
        s = self.ledger.state(key)
        for cmd in cmds:
            if isinstance(cmd, Idle) and cmd.instance_id not in s.instances:
                number = cmd.instance_id.removeprefix(f"{key}-")
                if number.isdigit() and int(number) > s.started:
                    return True
        return False

    async def _caught_up(self, key: str) -> bool:
        """Read the function's end of the stream before answering a group that appends nothing: a worker's report
        that decides nothing (a repeat, or one the state already holds), an Idle refused (or repeated), or anything
        while a loss is suspected.

        Nothing else would check it: no append, no order check. After a lost tail the state may hold what the
        stream no longer does (an instance ready there, creating here), and a report answered on it is acked
        and never sent again; the read finds the stream behind (StoreLost: reload, and the report is refused
        UNAVAILABLE, so its worker sends it again). True when it folded batches (another writer's): decide again."""
        held = self.ledger.last_seq.get(key, 0)
        await self.writer.catch_up(key)
        return self.ledger.last_seq.get(key, 0) != held

    async def _settle(self, key: str) -> list[Reply]:
        """Our last append of `key` got no answer: settle it first; what that batch assigned was never told."""
        return self.assignments(key) if await self.writer.settle(key, self.clock.now_ms()) else []

    def assignments(self, key: str) -> list[Reply]:
        """The answer of every request an instance of `key` serves, to each of its callers."""
        busy = [i for i in self.ledger.state(key).instances.values() if i.phase is Phase.BUSY]
        return [Reply(to=to, request_id=i.request_id, instance_id=i.id) for i in busy for to in i.waiters]


def _unsure(cmd: AnyCommand) -> bool:
    """A command whose answer, when it appends nothing, rests on the state alone: a platform worker's or gc worker's
    report (acked once answered, and not sent again), or an Idle refused (its caller does not send it again)."""
    return isinstance(cmd, SlotCreated | SlotReady | SlotFailed | SlotDestroyed | Idle)


def _releases(cmd: AnyCommand) -> bool:
    """An Idle is answered once decided: its caller waits for nothing that depends on it being stored."""
    return isinstance(cmd, Idle) and bool(cmd.reply_to)


def _own(cmd: AnyCommand, outcome: Decision | Exception) -> list[Reply]:
    """The replies of a decision to the command's own caller."""
    return [r for r in outcome.replies if r.to == cmd.reply_to] if isinstance(outcome, Decision) else []
