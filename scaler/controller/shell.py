"""The controller: the single writer of the functions of the partitions it leases, as a loop of commands.

For each command it reads the clock once, asks the pure core (through the ledger), appends the
resulting batch through the write path (scaler/controller/writer.py), and only then answers. Commands of
one function are decided in arrival order under its lock; different functions proceed
concurrently. Commands come three ways: `call` from the gateway in the same process (the hot path:
no NATS hop but the append; a call for a partition served elsewhere is forwarded), core NATS
requests on `cmd.<partition>` (front gateways, other nodes and the workers' reports), and the
controller's own timers (Tick, when a function's deadline is due) and cues (Cue, when a function that
another one on this node follows came back). Around that loop: which
partitions it serves (scaler/controller/partitions.py), whether it takes one more Assign
(scaler/controller/admission.py), and the snapshots kept ahead of retention (scaler/controller/snapshotter.py).
"""

import asyncio
import contextlib
import itertools
import logging
import secrets
import socket
from collections import deque
from typing import NamedTuple

from msgspec.structs import replace
from nats.aio.msg import Msg

from scaler.controller import rebuild, state_service
from scaler.controller.admission import MAX_BACKLOG, MAX_BEHIND_S, Admission
from scaler.controller.core import reconcile
from scaler.controller.core.decide import Decision
from scaler.controller.core.limits import NO_LIMITS, Limits
from scaler.controller.core.policy import Policy
from scaler.controller.core.state import FnState, Phase, Totals
from scaler.controller.leases import EVERY_S, TTL_S, ranges
from scaler.controller.ledger import Ledger
from scaler.controller.partitions import NotServing, Partitions
from scaler.controller.returns import Returns
from scaler.controller.shared import SharedTotals
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.controller.snapshotter import GUARD_EVERY_S, SNAPSHOT_EVERY, SNAPSHOT_INTERVAL_S, Snapshotter
from scaler.controller.timers import Timers
from scaler.controller.writer import Conflict, StoreLost, TooBig, Writer
from scaler.proto.commands import (
    AnyCommand,
    Assign,
    Cancel,
    Code,
    Cue,
    Delete,
    Idle,
    Reconcile,
    Reply,
    Restart,
    SlotCreated,
    Tick,
    command_id,
    decode_command,
    decode_reply,
    encode,
)
from scaler.proto.events import Batch, encode_batch, join
from scaler.proto.subjects import PARTITIONS, RECONCILE_ASK, UNLISTED, partition
from scaler.runtime import durability, stream
from scaler.runtime.bus import (
    DEFAULT_RETENTION,
    Retention,
    Unavailable,
    close,
    connect,
    ensure_stream,
    send,
    while_connected,
)
from scaler.runtime.clock import Clock
from scaler.runtime.forward import Forwarder
from scaler.runtime.tasks import cancelled
from scaler.runtime.text import plural

__all__ = ["GUARD_EVERY_S", "MAX_BACKLOG", "MAX_BEHIND_S", "Controller", "NotServing"]

log = logging.getLogger("scaler.controller")

ASK_TIMEOUT_S = 6.0  # a gc worker answers an ask once it knows whether the platform lists its slots
APPEND_ATTEMPTS = 3  # conflicts in a row before a command is refused
MAX_GROUP = 256  # commands of one function decided and appended together, at most
STEP_ROOM = 32  # bytes a decision's step adds to a batch holding several, beside its cause
CANCEL_PATIENCE_S = 120.0  # how long a Cancel is retried through an outage of the event store


class Controller:
    def __init__(
        self,
        nats_url: str,
        policy: Policy,
        clock: Clock | None = None,
        replicas: int = 0,
        node: str = "",
        lease_ttl_s: float = TTL_S,
        lease_every_s: float = EVERY_S,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
        max_backlog: int = MAX_BACKLOG,
        max_behind_s: float = MAX_BEHIND_S,
        limits: Limits = NO_LIMITS,
        retention: Retention = DEFAULT_RETENTION,
        guard_every_s: float = GUARD_EVERY_S,
        nats_monitor: str = "",
        nats_unsynced: bool = False,
    ) -> None:
        self.nats_url = nats_url
        self.policy = policy
        self.clock = clock or Clock()
        self.replicas = replicas  # 0: as durability.default_replicas says (3 on a cluster)
        self.nats_monitor = nats_monitor  # where to ask whether NATS syncs every write
        self.nats_unsynced = nats_unsynced  # ... and not syncing is intended: no warning
        self.sync = durability.Sync.UNKNOWN
        self.node = node or f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self.reclaim_leases = False  # `node` is held by this process alone: take its earlier incarnation's leases
        self.lease_ttl_s = lease_ttl_s
        self.lease_every_s = lease_every_s
        self.limits = limits
        self.retention = retention  # set on the stream at start; what the snapshots must keep ahead of
        self.snapshot_every = snapshot_every
        self.snapshot_interval_s = snapshot_interval_s
        self.guard_every_s = guard_every_s
        self.admission = Admission(max_backlog, max_behind_s)
        self.ledger = Ledger()
        self.serving: set[int] = set()  # partitions loaded and answered here (Partitions keeps it)
        self.timers = Timers(self.clock, self._tick)
        self.forwarder: Forwarder | None = None  # for calls whose partition another node serves
        self.writer: Writer | None = None
        self.snapshots: Snapshotter | None = None
        self.partitions: Partitions | None = None
        self.shared: SharedTotals | None = None  # the run's totals across nodes
        self.returns: Returns | None = None  # returns from a lull, told across nodes (a policy that follows leaders)
        # Per function with commands under way, in arrival order; gone with the last, so an idle function costs none.
        self._lanes: dict[str, deque[_Queued]] = {}
        self._local: dict[str, asyncio.Future[Reply]] = {}  # callers in this process, by their reply_to
        self._tokens = itertools.count()
        self._inbox = ""
        self._tasks: set[asyncio.Task] = set()
        self.losses = 0  # times EVENTS was found to hold less than this node had folded (not by retention)
        self.unreconciled = 0  # loads of partitions the platform could not be reconciled for (it cannot list slots)
        self._asking: asyncio.Task | None = None  # the ask to reconcile under way
        self._reloading = False
        self._lag_watch: asyncio.Task | None = None
        self._nc = None
        self._js = None
        self._state_sub = None

    # What tests, metrics and tools read.
    @property
    def states(self) -> dict[str, FnState]:
        return self.ledger.states

    @property
    def totals(self) -> Totals:
        return self.ledger.totals

    @property
    def leases(self):
        return self.partitions.leases if self.partitions is not None else None

    @property
    def loaded_batches(self) -> int:
        return self.partitions.loaded_batches if self.partitions is not None else 0

    @property
    def snapshot_saved_s(self) -> float | None:
        return self.snapshots.saved_s if self.snapshots is not None else None

    def serves(self, key: str) -> bool:
        return partition(key) in self.serving

    def snapshot(self, partitions: set[int] | None = None) -> Snapshot:
        return self.snapshots.snapshot(partitions)

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, f"controller {self.node}")
        stream.check_server(self._nc)
        self.replicas = self.replicas or durability.default_replicas(self._nc)
        monitors = durability.monitor_urls(self.nats_url, self.nats_monitor)
        self.sync = await durability.server_sync(monitors)
        durability.warn(self.sync, monitors, self.nats_unsynced)
        self._js = self._nc.jetstream()
        v = self._nc.connected_server_version
        config = await ensure_stream(
            self._js, self.replicas, self.retention, atomic=(v.major, v.minor) >= stream.OLDEST_ATOMIC
        )
        await stream.check_layout(self._js)
        stream_id = await stream.stream_id(self._js)
        store = SnapshotStore(self._js, self.replicas)
        await store.open()
        self.writer = Writer(self._nc, self._js, self.ledger, self.serves, atomic=bool(config.allow_atomic))
        self.snapshots = Snapshotter(
            self._js,
            store,
            self.ledger,
            self.clock,
            self.retention,
            self.serving,
            self.writer.floor,
            self._holds,
            self._events_lost,
            stream_id,
            self.snapshot_every,
            self.snapshot_interval_s,
            self.guard_every_s,
        )
        self._inbox = self._nc.new_inbox()
        await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_answer)
        self.forwarder = Forwarder.over(self._nc)
        await self.forwarder.start()
        self.timers.start()
        self._lag_watch = asyncio.create_task(self._watch_lag())
        self._state_sub = await state_service.serve(self._nc, self.node, self.snapshot, self.serving)
        self.partitions = Partitions(
            self._nc,
            self._js,
            self.ledger,
            store,
            self.snapshots,
            self.serving,
            self._on_request,
            self._served,
            self._released,
            self.node,
            self.limits,
            self.lease_ttl_s,
            self.lease_every_s,
            self.replicas,
            reclaim=self.reclaim_leases,
        )
        self.shared = SharedTotals(
            self._js, self.node, self.ledger, self.lease_ttl_s, self.lease_every_s, self.replicas
        )
        await self.shared.start()
        if self.policy.follows_leaders:
            self.returns = Returns(self._nc, self.node, self.ledger, self.clock, self._cue)
            await self.returns.start()
        self.snapshots.start()
        await self.partitions.start()
        functions, batches = plural(len(self.states), "function"), plural(self.loaded_batches, "batch", "batches")
        refused = self.partitions.refused
        refusing = f", REFUSING partitions {ranges(sorted(refused))} (see the error above)" if refused else ""
        return (
            f"controller {self.node} ({self.policy.name} policy, {len(self.serving)} of {PARTITIONS} partitions"
            f"{refusing}, {functions}, {batches} read; {durability.describe(self.sync, self.replicas)})"
        )

    async def drain(self) -> str:
        """Hand this node's partitions to the other nodes before it stops (SIGTERM, `scaler drain`): each
        snapshotted at the newest watermark while still leased, then freed; none taken again. The gateway
        still serves meanwhile, passing calls on to the new owners. Returns what became of them."""
        if self.partitions is None:
            return f"{self.node} is not running"
        said: list[str] = []

        async def hand_over() -> None:
            await self.snapshots.stop()
            said.append(await self.partitions.leases.drain())

        # NATS gone (an embedded one stopped with us): nobody can take a partition over, nor see one freed
        if not await while_connected(self._nc, hand_over(), "handing its partitions over; their leases lapse"):
            return f"{self.node}: NATS is away, no hand-over; its leases lapse"
        log.info("drained: %s", said[0])
        return said[0]

    async def stop(self) -> None:
        if self.snapshots is not None:
            await self.snapshots.stop()  # its last look at the stream waits 1 s at most
        await while_connected(self._nc, self._give_back(), "snapshots; its leases lapse")
        await self.timers.stop()
        await cancelled(self._lag_watch)
        await cancelled(self._asking)  # no gc worker may be there to answer (a node alone)
        if self.forwarder is not None:
            await self.forwarder.stop()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        await close(self._nc)

    async def _give_back(self) -> None:
        if self.partitions is not None:
            await self.partitions.stop()  # gives every partition back, each snapshotted
        if self.shared is not None:
            await self.shared.stop()
        if self.returns is not None:
            await self.returns.stop()
        if self._state_sub is not None:
            await self._state_sub.unsubscribe()

    # --- partitions served and released --------------------------------------------------------

    async def functions(self) -> dict[str, FnState]:
        """Every function the running controllers hold (scaler.Admin/List), asked of each over NATS."""
        return (await state_service.fetch(self._nc)).states

    async def _events_lost(self, why: str) -> None:
        """EVENTS holds less than this node folded, and not by retention: an alarm (a log line, the losses
        metric), then every partition served is reloaded from the stream (no snapshot of the suspect state)
        and the platform is asked to reconcile it (the gc workers list its slots, where it can)."""
        if self._reloading:
            return
        self._reloading = True
        try:
            self.losses += 1
            partitions = sorted(self.serving | set(self.partitions.loading))
            log.error("EVENTS lost batches: %s; reloading partitions %s from the stream and reconciling them",
                      why, ranges(partitions))  # fmt: skip

            async def start_over() -> None:
                with contextlib.suppress(Exception):  # a stream gone is made again (empty)
                    await ensure_stream(self._js, self.replicas, self.retention)
                at = await rebuild.kept(self._js)
                self.ledger.seq = 0
                self.snapshots.restart(at.stream_id, at.last_seq)

            await self.partitions.reload(partitions, start_over)
        except Exception as e:  # NATS away meanwhile: the next look finds it again
            log.warning("could not reload after the loss: %s", e)
        finally:
            self._reloading = False

    async def _holds(self, p: int) -> bool:
        """Whether partition `p`'s lease is still ours, confirmed now (a snapshot is written only then)."""
        return self.partitions is not None and await self.partitions.leases.confirm(p)

    async def _served(self, partitions: list[int]) -> None:
        """Loaded and served: arm their timers, tell their callers again what they were assigned, and have the
        platform reconciled (a take-over, or a reload after a loss, may hold instances the platform lost, or
        miss slots it made)."""
        for key in self.partitions.keys(partitions):
            self.timers.set(key, self.ledger.wake.get(key))
        await self._answer_again(partitions)
        if self._asking is None or self._asking.done():  # one ask at a time answers for every load before it
            self._asking = asyncio.create_task(self._ask_reconcile())

    async def _ask_reconcile(self, patience_s: float = 30.0) -> None:
        """Ask the gc workers to reconcile, until one answers (none may be connected just now)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience_s
        while True:
            try:
                answer = await self._nc.request(RECONCILE_ASK, b"", timeout=ASK_TIMEOUT_S)
                if answer.data == UNLISTED:  # the platform cannot list its slots: what it holds stays unchecked
                    self.unreconciled += 1
                return
            except Exception as e:
                if loop.time() > deadline:
                    log.warning("no gc worker answered the ask to reconcile (%s)", type(e).__name__)
                    return
                await asyncio.sleep(0.5)

    async def _released(self, served: list[int], partitions: list[int]) -> None:
        """Given up, their commands done: snapshot those served (at the newest watermark when stopping), forget all."""
        await asyncio.gather(*(self.snapshots.save(p, force=self.snapshots.stopping) for p in served))
        for key in self.partitions.keys(partitions):
            self.timers.set(key, None)
            self.ledger.forget(key)
        gone = set(partitions)
        self.writer.forget(lambda key: partition(key) in gone)  # the next owner reads the stream: it knows
        self.snapshots.forget(partitions)

    # --- commands -----------------------------------------------------------------------------

    async def call(self, cmd: Assign | Idle | Restart | Delete, timeout_s: float | None) -> Reply:
        """Decide a call from this process and wait for its answer (an Assign may wait for an instance).

        A call whose partition another node serves is forwarded to it. An Assign whose caller stops
        waiting (timeout, cancellation, or the event store away when its outcome is unknown) is
        cancelled in the background, so a stored request never holds an instance for nobody.
        """
        if not self.serves(cmd.key):
            return await self.forwarder.call(cmd, timeout_s)
        if (refused := self._overloaded(cmd)) is not None:
            return refused
        to = f"{self._inbox}.{next(self._tokens)}"  # a real subject: after a hand-over the new owner answers it
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._local[to] = answer
        cmd = replace(cmd, reply_to=to)
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    await self.handle(cmd)
                except NotServing:  # the partition went elsewhere just now
                    del self._local[to]
                    return await self.forwarder.call(cmd, timeout_s)
                except TooBig as e:
                    return _unstorable(cmd, to, e)
                return await answer
        except (TimeoutError, asyncio.CancelledError, Unavailable) as e:
            if isinstance(cmd, Assign) and to in self._local:
                why = {TimeoutError: "no answer in time", Unavailable: "event store unavailable"}
                self._give_up(cmd, why.get(type(e), "caller disconnected"))
            raise
        finally:
            self._local.pop(to, None)

    def _overloaded(self, cmd: AnyCommand) -> Reply | None:
        """Refuse a new Assign at once when the node is behind, rather than let every call queue for seconds."""
        if not isinstance(cmd, Assign):
            return None
        lag = self.admission.lag_s
        behind = max(self.admission.behind_s(), lag)  # a backlog from the store's outage is its own
        return self.admission.refuse(cmd, self.node, self.writer.troubled(behind, own_lag_s=lag))

    async def handle(self, cmd: AnyCommand) -> Decision:
        """Decide one command of one function, append its batch, answer: in the function's arrival order.

        The command joins its function's queue. While an append of the function is in flight, the
        commands arriving meanwhile wait; then they are decided in arrival order and appended together,
        one message and one ack for all (group commit). Functions do not wait for each other.
        """
        if isinstance(cmd, Reconcile) and cmd.partition >= 0:
            return await self._reconcile(cmd)
        p = partition(cmd.key)
        self.partitions.check(p)
        self.partitions.entered(p)
        queued = _Queued(cmd, asyncio.get_running_loop().create_future(), self.admission.arrived())
        lane = self._lanes.get(cmd.key)
        if lane is not None:  # an append of the function is under way: wait for its queue to reach this one
            lane.append(queued)
            return await asyncio.shield(queued.done)  # a caller that stops waiting: decided all the same
        lane = self._lanes[cmd.key] = deque([queued])  # none: decided at once, in the caller's own task
        try:
            await self._group(cmd.key, lane)
        finally:
            if lane:  # those that came meanwhile
                self._spawn(self._run(cmd.key, lane))
            else:
                del self._lanes[cmd.key]
            if queued.done.done() and not queued.done.cancelled():
                queued.done.exception()  # seen, even by a caller cancelled meanwhile
        return queued.done.result()

    async def _run(self, key: str, lane: deque["_Queued"]) -> None:
        """Decide and store the function's queued commands, a group at a time, until none is left."""
        try:
            while lane:
                await self._group(key, lane)
        finally:
            del self._lanes[key]
            for q in lane:  # cancelled while running: nothing is left waiting
                self._done(q, NotServing(f"{key}: its queue stopped"))

    async def _group(self, key: str, lane: deque["_Queued"]) -> None:
        """Decide and store the commands at the head of the function's queue, together, and answer them."""
        group = [lane.popleft() for _ in range(min(len(lane), MAX_GROUP))]
        taken, outcomes = group, []
        try:
            outcomes = await self._decide_and_append(key, [q.cmd for q in group])
            taken = group[: len(outcomes)]
            lane.extendleft(reversed(group[len(outcomes) :]))  # past the payload limit: the next group
            decided = [o for o in outcomes if isinstance(o, Decision)]
            await self._answer([r for d in decided for r in d.replies])
            self._cue([c for d in decided for c in self.ledger.cues(d)])
            if self.returns is not None:
                await self.returns.tell(decided)
        except Exception as e:
            if isinstance(e, StoreLost):  # the stream is behind this node: reload, and callers try again
                self._spawn(self._events_lost(str(e)))
            if outcomes:  # decided and stored, but an answer could not go out (NATS away): it is kept
                log.warning("%s: could not answer: %s", key, e)
            else:  # the partition went, or the store did: nothing of the group decided
                outcomes = [e] * len(group)
        finally:
            for i, q in enumerate(taken):  # short of outcomes only when cancelled
                self._done(q, outcomes[i] if i < len(outcomes) else NotServing(f"{key}: its queue stopped"))

    def _done(self, q: "_Queued", outcome: Decision | BaseException) -> None:
        self.admission.decided(q.token)
        self.partitions.left(partition(q.cmd.key))
        if not q.done.done():
            if isinstance(outcome, BaseException):
                q.done.set_exception(outcome)
            else:
                q.done.set_result(outcome)

    async def _decide_and_append(self, key: str, cmds: list[AnyCommand]) -> list[Decision | Exception]:
        """Decide the commands in order, each on the state the one before left, and append their batches as one.

        One outcome per command taken, in order: its decision, stored; or TooBig when its decision alone is
        more than a message holds (it is not stored; the next command is decided as if it never came). Those
        whose batches would take the message past NATS's payload limit are not taken (left for the next
        group). A conflict folds the other writer's batches and decides the group again.
        """
        p = partition(key)
        room = self._nc.max_payload - stream.HEADERS_ROOM
        looked = False
        for _ in range(APPEND_ATTEMPTS):
            if p not in self.serving:
                raise NotServing(f"partition {p} was given up")
            await self._settle(key)
            if not looked and self._unseen(key, cmds):
                looked = True
                await self.writer.catch_up(key)
            self.partitions.check(p)  # fenced: nothing decided or answered past the lease's renewal deadline
            outcomes: list[Decision | Exception] = []
            decided: list[tuple[AnyCommand, Decision, bool]] = []
            batches: list[Batch] = []
            size, last = 0, None
            for cmd in cmds:
                now = self.clock.now_ms()
                decision = self.ledger.decide(cmd, now, self.policy, last)
                batch = self.ledger.batch(cmd, decision, now)
                if batch is not None and len(cmds) > 1:  # alone, the append itself says when it is too big
                    alone = len(encode_batch(batch))
                    try:
                        stream.fits(alone, self._nc.max_payload)
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
            seq = None
            if batches:
                try:
                    seq = await self.writer.append(join(batches))
                except Conflict:
                    log.warning("conflict on %s: catching up and deciding again", key)
                    await self.writer.catch_up(key)
                    # What the folded batches assigned was never told: another writer's, or our own whose
                    # answer was lost (stored while NATS stood still, then tried again), whose decision
                    # taken again here is a no-op that answers nobody.
                    await self._answer(self._assignments(key))
                    continue
                self.snapshots.appended(p, sum(len(b.events) for b in batches))
            for cmd, decision, stored in decided:
                self.ledger.commit(cmd, decision, seq if stored else None)
            self.timers.set(key, self.ledger.wake.get(key))
            return outcomes
        raise Unavailable(f"{APPEND_ATTEMPTS} conflicts in a row on {key!r}")

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

    async def _settle(self, key: str) -> None:
        """Our last append of `key` got no answer: settle it first, then tell what that batch assigned."""
        if await self.writer.settle(key):
            self.timers.set(key, self.ledger.wake.get(key))
            await self._answer(self._assignments(key))  # what that batch assigned was never told

    async def _reconcile(self, cmd: Reconcile) -> Decision:
        """The platform's list for one partition, put to each of its functions in turn (those the list names
        and those it doesn't), each deciding alone, so a repeat after a crash half-way repeats only no-ops."""
        if cmd.partition not in self.serving:
            raise NotServing(f"partition {cmd.partition} is not served by {self.node}")
        known = self.partitions.keys([cmd.partition])
        for key, slots in reconcile.by_function(cmd.slots, known).items():
            await self.handle(replace(cmd, key=key, slots=slots, partition=-1))
        log.debug("reconciled partition %d: %d functions, %d platform slots", cmd.partition, len(known), len(cmd.slots))
        return Decision([], [], self.ledger.state(cmd.key), None)

    async def _answer(self, replies: list[Reply]) -> None:
        for reply in replies:
            waiter = self._local.get(reply.to)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(reply)
            elif not reply.to.startswith(self._inbox):  # a caller of another process, waiting on NATS
                await self._nc.publish(reply.to, encode(reply))
            # else a caller of this process that stopped waiting

    async def _on_answer(self, msg: Msg) -> None:
        """An answer decided by another node for a caller of ours (its partition changed hands meanwhile)."""
        waiter = self._local.get(msg.subject)
        if waiter is not None and not waiter.done() and msg.data:
            waiter.set_result(decode_reply(msg.data))

    def _give_up(self, cmd: Assign, why: str) -> None:
        cancel = Cancel(key=cmd.key, request_id=cmd.request_id, reply_to=cmd.reply_to, reason=why)
        self._spawn(self._cancel(cancel))

    async def _cancel(self, cancel: Cancel) -> None:
        """Cancel through an outage or a hand-over: the Assign may have been stored all the same."""
        deadline = asyncio.get_running_loop().time() + CANCEL_PATIENCE_S
        delay = 0.05
        while True:
            try:
                if self.serves(cancel.key):
                    await self.handle(cancel)
                else:
                    await send(self._nc, cancel, patience_s=max(0.1, deadline - asyncio.get_running_loop().time()))
                return
            except TooBig as e:
                log.error("could not cancel %s: %s", cancel.request_id, e)
                return
            except (Unavailable, TimeoutError) as e:
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("could not cancel %s: %s", cancel.request_id, e)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _watch_lag(self, every_s: float = 0.05) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await asyncio.sleep(every_s)
            self.admission.lagged(loop.time() - began - every_s)

    async def _tick(self, key: str, due_ms: int) -> None:
        await self._own(Tick(key=key, due_ms=due_ms), "the deadline's")

    def _cue(self, cues: list[Cue]) -> None:
        """A function came back, here or on another node (`Returns`): cue those that follow it on this node."""
        for cue in cues:
            self._spawn(self._cued(cue))

    async def _cued(self, cue: Cue) -> None:
        try:
            await self._own(cue, "a cue's")
        except Unavailable as e:  # a cue is worth something now or never: it is not sent again
            log.info("%s: the cue of %s's return is dropped: %s", cue.key, cue.leader, e)

    async def _own(self, cmd: Tick | Cue, what: str) -> None:
        """A command of the node's own, decided like any when it still serves the function."""
        if self.serves(cmd.key):
            try:
                await self.handle(cmd)
            except TooBig as e:  # deciding it again would only fail again: the next command tries
                log.error("%s: %s decision cannot be stored: %s", cmd.key, what, e)

    async def _on_request(self, msg: Msg) -> None:
        """A command from another process: a gateway's call, or a worker's report."""
        try:
            cmd = decode_command(msg.data)
        except Exception as e:
            log.error("refusing an unreadable command on %s: %s", msg.subject, e)
            if msg.reply:
                reply = Reply(to=msg.reply, request_id="", code=Code.INVALID_ARGUMENT, message=str(e))
                await self._nc.publish(msg.reply, encode(reply))
            return
        self._spawn(self._serve(cmd, msg))

    async def _serve(self, cmd: AnyCommand, msg: Msg) -> None:
        """Calls are answered by their decision (now or, for a waiting Assign, later); reports once stored (a
        SlotCreated by its decision too: it says whether to go on with Init)."""
        is_call = isinstance(cmd, Assign | Idle | SlotCreated | Restart | Delete)
        if is_call:
            cmd = replace(cmd, reply_to=msg.reply)
            if (refused := self._overloaded(cmd)) is not None:
                await self._nc.publish(msg.reply, encode(refused))
                return
        try:
            await self.handle(cmd)
        except Unavailable as e:  # the sender tries again
            log.info("could not handle %s: %s", command_id(cmd), e)
            if msg.reply:
                reply = Reply(to=msg.reply, request_id=getattr(cmd, "request_id", ""), code=Code.UNAVAILABLE)
                await self._nc.publish(msg.reply, encode(replace(reply, message=str(e))))
            return
        except TooBig as e:  # refused once: sending it again would fail again
            if msg.reply:
                await self._nc.publish(msg.reply, encode(_unstorable(cmd, msg.reply, e)))
            return
        if not is_call and msg.reply:
            await self._nc.publish(msg.reply, encode(Reply(to=msg.reply, request_id=command_id(cmd))))

    async def _answer_again(self, partitions: list[int]) -> None:
        """Send every busy instance's assignment once more to its callers.

        An answer goes out after its batch is stored: a controller killed in between stored the
        assignment but never told the caller, and a retried call finds it already done. A caller
        that has its answer ignores the copy; one of a dead process is gone with it.
        """
        for key in self.partitions.keys(partitions):
            await self._answer(self._assignments(key))

    def _assignments(self, key: str) -> list[Reply]:
        """The answer of every request an instance of `key` serves, to each of its callers."""
        busy = [i for i in self.ledger.state(key).instances.values() if i.phase is Phase.BUSY]
        return [Reply(to=to, request_id=i.request_id, instance_id=i.id) for i in busy for to in i.waiters]

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Queued(NamedTuple):
    cmd: AnyCommand
    done: asyncio.Future[Decision]
    token: int  # admission's


def _unstorable(cmd: AnyCommand, to: str, e: TooBig) -> Reply:
    """The answer to a command whose decision no NATS message can hold: refused, not to be tried again."""
    log.error("%s refused: its decision cannot be stored: %s", command_id(cmd), e)
    message = f"the decision cannot be stored: {e}"
    return Reply(to=to, request_id=getattr(cmd, "request_id", ""), code=Code.INTERNAL, message=message)
