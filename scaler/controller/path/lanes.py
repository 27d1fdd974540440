"""The functions' lanes: each function's commands decided and stored a group at a time, in arrival order.

A command joins its function's queue; the function's runner takes what queued while its previous
append was in flight as one group (group commit: one message and one ack for all), has the lane decide
and store it, then delivers what it committed: the replies, the function's next deadline, the cues of
the functions that follow it. Once nothing more waits (or every PLAN_EVERY groups under a steady flow)
it has the function's plan decided and stored, once the group's callers have run on: a warm Assign's
answer goes out before its function's plan is decided, not behind it. Functions do not wait for each
other; a function with nothing under way costs nothing.

A command that has waited `store_wait_s` (2.5 s) for its decision to be stored, while the event store does not
answer (an append or a read stalled or failing), is answered UNAVAILABLE then, queued or in flight: its caller
learns the store is away well within its own deadline, and repeats it. One still queued is not decided at all.
"""

import asyncio
import logging
from collections import deque
from typing import NamedTuple

from scaler.controller.partitions import NotServing, Partitions
from scaler.controller.path.admission import Admission
from scaler.controller.path.lane import Committed, Lane
from scaler.controller.path.replies import Replies
from scaler.controller.path.timers import Timers
from scaler.controller.path.writer import StoreLost
from scaler.controller.returns import Returns
from scaler.proto.commands import AnyCommand, Cue, Tick
from scaler.proto.subjects import partition
from scaler.runtime.bus import Unavailable
from scaler.runtime.tasks import cancelled
from scaler.store import TooBig

log = logging.getLogger("scaler.controller")

MAX_GROUP = 256  # commands of one function decided and appended together, at most
PLAN_EVERY = 8  # groups decided in a row before the function's plan is stored, while commands keep coming
RETRY_PLAN_MS = 1_000  # a plan that could not be stored is tried again by a Tick this much later
STORE_WAIT_S = 2.5  # how long a command waits for a store that does not answer before it is refused UNAVAILABLE


class Told(Unavailable):
    """Nothing of the group was stored, but this command's caller was answered already (an Idle's release):
    it is the node's to store all the same."""


class _Queued(NamedTuple):
    cmd: AnyCommand
    done: asyncio.Future
    token: int  # admission's
    at: float  # when it came (the event loop's clock)


class Lanes:
    def __init__(
        self,
        lane: Lane,
        replies: Replies,
        timers: Timers,
        admission: Admission,
        partitions: Partitions,
        returns: Returns | None,
        lost,
        store_wait_s: float = STORE_WAIT_S,
    ) -> None:
        self.lane = lane
        self.ledger = lane.ledger
        self.replies = replies
        self.timers = timers
        self.admission = admission
        self.partitions = partitions
        self.returns = returns  # told of functions that came back (a policy that follows leaders)
        self.lost = lost  # the store holds less than this node folded: reload (Recovery.lost)
        self.store_wait_s = store_wait_s
        self.store_refused = 0  # commands answered UNAVAILABLE because the store did not answer in time
        self._queues: dict[str, deque[_Queued]] = {}  # per function with commands under way, in arrival order
        self._taken: dict[str, list[_Queued]] = {}  # per function, the group being decided and stored
        self._told: dict[str, set[str]] = {}  # per function, the group in flight's callers answered already
        self._tasks: set[asyncio.Task] = set()
        self._watch: asyncio.Task | None = None  # refuses what waited store_wait_s on a store that does not answer

    @property
    def busy(self) -> bool:
        """Whether any function has commands being decided or stored."""
        return bool(self._queues)

    def submit(self, cmd: AnyCommand) -> asyncio.Future:
        """Queue a command of a function this node serves; the future of its decision (set once stored; a
        caller that stops waiting leaves it decided all the same). NotServing at once when not served."""
        p = partition(cmd.key)
        self.partitions.check(p)
        self.partitions.entered(p)
        loop = asyncio.get_running_loop()
        queued = _Queued(cmd, loop.create_future(), self.admission.arrived(), loop.time())
        queued.done.add_done_callback(_seen)
        queue = self._queues.get(cmd.key)
        if queue is None:
            queue = self._queues[cmd.key] = deque()
            self.spawn(self._run(cmd.key, queue))
            if self._watch is None:
                self._watch = loop.create_task(self._watch_store())
        queue.append(queued)
        return queued.done

    async def own(self, cmd: Tick | Cue, what: str) -> None:
        """A command of the node's own, decided like any when it still serves the function."""
        if self.partitions.serves(cmd.key):
            try:
                await asyncio.shield(self.submit(cmd))
            except TooBig as e:  # deciding it again would only fail again: the next command tries
                log.error("%s: %s decision cannot be stored: %s", cmd.key, what, e)

    async def tick(self, key: str, due_ms: int) -> None:
        await self.own(Tick(key=key, due_ms=due_ms), "the deadline's")

    def cue(self, cues: list[Cue]) -> None:
        """A function came back, here or on another node: cue those that follow it on this node."""
        for cue in cues:
            self.spawn(self._cued(cue))

    async def stop(self, connected: bool = True) -> None:
        """Let what is under way finish (10 s at most); with NATS away nothing can, and it is cancelled."""
        await cancelled(self._watch)
        if self._tasks and connected:
            await asyncio.wait(self._tasks, timeout=10)
        await cancelled(*self._tasks)

    async def _cued(self, cue: Cue) -> None:
        try:
            await self.own(cue, "a cue's")
        except Unavailable as e:  # a cue is worth something now or never: it is not sent again
            log.info("%s: the cue of %s's return is dropped: %s", cue.key, cue.leader, e)

    async def _run(self, key: str, queue: deque[_Queued]) -> None:
        """Decide and store the function's queued commands, a group at a time, and plan when none is left."""
        groups = 0
        try:
            while queue:
                planned = await self._group(key, queue)
                groups = 0 if planned else groups + 1
                if groups and not queue:  # the group's callers answered first: planning is beside the reply path
                    await asyncio.sleep(0)
                if groups and (not queue or groups % PLAN_EVERY == 0):
                    await self._plan(key)
                    groups = 0
        finally:
            del self._queues[key]
            self._told.pop(key, None)
            for q in queue:  # cancelled while running: nothing is left waiting
                self._done(q, NotServing(f"{key}: its queue stopped"))

    async def _group(self, key: str, queue: deque[_Queued]) -> bool:
        """Decide and store the commands at the head of the function's queue, together, and deliver the rest;
        whether the function's plan was stored with them."""
        group = []
        while queue and len(group) < MAX_GROUP:
            q = queue.popleft()
            if q.done.done():  # refused while it queued (the store did not answer): not decided
                self._done(q, None)
            else:
                group.append(q)
        if not group:
            return False
        taken, outcomes, told, planned = group, [], self._told.setdefault(key, set()), False
        told.clear()
        self._taken[key] = group
        try:
            committed = await self.lane.commit(key, [q.cmd for q in group], told)
            outcomes, planned = committed.outcomes, committed.planned
            taken = group[: len(outcomes)]
            queue.extendleft(reversed(group[len(outcomes) :]))  # past the payload limit: the next group
            await self._deliver(key, committed)
        except Exception as e:
            if isinstance(e, StoreLost):  # the stream is behind this node: reload, and callers try again
                self.spawn(self.lost(str(e)))
            if outcomes:  # decided and stored, but an answer could not go out (NATS away): it is kept
                log.warning("%s: could not answer: %s", key, e)
            else:  # the partition went, or the store did: nothing of the group decided
                outcomes = [Told(str(e)) if getattr(q.cmd, "reply_to", "") in told else e for q in group]
        finally:
            self._taken.pop(key, None)
            for i, q in enumerate(taken):  # short of outcomes only when cancelled
                self._done(q, outcomes[i] if i < len(outcomes) else NotServing(f"{key}: its queue stopped"))
        return planned

    async def _deliver(self, key: str, committed: Committed) -> None:
        await self.replies.send(committed.replies)
        self.timers.set(key, self.ledger.wake.get(key))
        self.cue(committed.cues)
        if self.returns is not None:
            await self.returns.tell(committed.decided)

    async def _plan(self, key: str) -> None:
        """The function's plan stored; one that cannot be is tried again by a Tick a moment later. It is under
        way as a command is: a partition given up waits for it, so its snapshot holds the plan."""
        if not self.partitions.serves(key):
            return
        p = partition(key)
        self.partitions.entered(p)
        try:
            await self.lane.plan(key)
        except NotServing:
            return
        except Exception as e:
            if isinstance(e, StoreLost):
                self.spawn(self.lost(str(e)))
            log.info("%s: its plan could not be stored (%s); again in %d ms", key, e, RETRY_PLAN_MS)
            self.timers.set(key, self.lane.clock.now_ms() + RETRY_PLAN_MS)
            return
        finally:
            self.partitions.left(p)
        self.timers.set(key, self.ledger.wake.get(key))

    async def _watch_store(self) -> None:
        """Every eighth of `store_wait_s`: the commands that have waited that long for their decision to be stored,
        queued or in flight, are refused UNAVAILABLE when that wait is the store's (else they are looked at again:
        a busy machine, a long queue are admission's). Not the node's own (no caller; a Tick not decided loses its
        deadline), nor one whose caller has its answer already (an Idle told of its release: the node stores it
        all the same). One look for every command, rather than a timer each."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.store_wait_s / 8)
            late = loop.time() - self.store_wait_s
            waited = [
                q
                for key, queue in self._queues.items()
                for q in (*self._taken.get(key, ()), *queue)
                if q.at <= late and not q.done.done() and not isinstance(q.cmd, Tick | Cue)
                and getattr(q.cmd, "reply_to", "") not in self._told.get(key, ())
            ]  # fmt: skip
            if waited and self.lane.writer.troubled(self.store_wait_s, own_lag_s=self.admission.lag_s):
                self.store_refused += len(waited)
                for q in waited:
                    q.done.set_exception(Unavailable(f"the event store did not store it within {self.store_wait_s:g}s"))

    def _done(self, q: _Queued, outcome) -> None:
        self.admission.decided(q.token)
        self.partitions.left(partition(q.cmd.key))
        if not q.done.done():
            if isinstance(outcome, BaseException):
                q.done.set_exception(outcome)
            else:
                q.done.set_result(outcome)

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _seen(done: asyncio.Future) -> None:
    """An outcome nobody waits for any more (its caller gave up) is still looked at: no 'never retrieved'."""
    if not done.cancelled():
        done.exception()
