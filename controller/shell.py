"""The controller's I/O: the single writer of the functions of the partitions it leases.

For each command it reads the clock once, asks the pure core (through the ledger), appends the
resulting batch to the function's subjects with the expected last sequence of the function (so
a second writer fails instead of corrupting the stream), and only then answers. Commands of one
function are decided in arrival order under its lock; different functions proceed concurrently.

Partitions come and go with their leases (controller/leases.py): one gained is loaded from its
snapshot and the batches after it (controller/rebuild.py), then served; one lost stops being
served, is snapshotted and dropped. Snapshots are kept ahead of the stream's retention: every
second the controller looks at what EVENTS keeps and snapshots each partition whose snapshot
falls into the older half of it, or is older than a quarter of the retention's age, so that the
batches retention drops are always held by a snapshot. Commands come three ways: `call` from
the gateway in the same process (the hot path: no NATS hop but the append; a call for a
partition served elsewhere is forwarded), core NATS requests on `cmd.<partition>` (front
gateways, other nodes and the workers' reports), and the controller's own timers (Tick, when a
function's deadline is due).
"""

import asyncio
import contextlib
import itertools
import logging
import secrets
import socket
import time
import weakref
from collections import Counter, deque

from msgspec.structs import replace
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from controller import rebuild, state_service, stream
from controller.core import reconcile
from controller.core.decide import Decision
from controller.core.limits import NO_LIMITS, Limits
from controller.core.policy import Policy
from controller.core.state import FnState, Phase, Totals
from controller.leases import EVERY_S, TTL_S, Leases
from controller.ledger import Ledger
from controller.shared import SharedTotals
from controller.snapshots import Snapshot, SnapshotStore
from controller.timers import Timers
from gateway.forward import Forwarder
from proto.commands import (
    AnyCommand,
    Assign,
    Cancel,
    Code,
    Idle,
    Reconcile,
    Reply,
    SlotCreated,
    Tick,
    command_id,
    decode_command,
    decode_reply,
    encode,
)
from proto.events import Batch, encode_batch
from proto.subjects import CMD, EVENTS, PARTITIONS, event_subject, function_events, partition
from runtime.bus import (
    DEFAULT_RETENTION,
    Retention,
    Unavailable,
    close,
    connect,
    ensure_stream,
    retention_of,
    send,
    set_retention,
    while_connected,
)
from runtime.clock import Clock
from runtime.tasks import cancelled
from runtime.text import plural

log = logging.getLogger("scaler.controller")

APPEND_ATTEMPTS = 3  # conflicts in a row before a command is refused
APPEND_TIMEOUT_S = 5.0
APPEND_PATIENCE_S = 10.0  # how long an append is retried while JetStream does not answer (a cluster's failover)
CANCEL_PATIENCE_S = 120.0  # how long a Cancel is retried through an outage of the event store
# Overload: a new Assign is refused at once while the node is behind: when the oldest command not
# yet decided arrived more than MAX_BEHIND_S ago, or the event loop itself runs that late (calls
# queue in gRPC before they reach us; a weighted mean, so a burst of a second or two is absorbed); or when
# MAX_BACKLOG commands wait to be decided (memory and latency stay bounded).
MAX_BEHIND_S = 2.0
STORE_TROUBLE_S = 5.0  # an append failed to reach JetStream this recently: a backlog is the store's, not overload
MAX_BACKLOG = 4096
LOAD_ERROR_EVERY_S = 600.0
SNAPSHOT_EVERY = 10_000  # events in a partition
SNAPSHOT_INTERVAL_S = 60.0
GUARD_EVERY_S = 1.0  # how often the stream's retention is compared with the snapshots
OWNERS = "owners"  # the queue group of cmd.<partition>: one node answers each command, even mid-hand-over


class NotServing(Unavailable):
    """This node does not (or no longer) serve the command's partition: another node, or soon."""


class Controller:
    def __init__(
        self,
        nats_url: str,
        policy: Policy,
        clock: Clock | None = None,
        replicas: int = 1,
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
    ) -> None:
        self.nats_url = nats_url
        self.policy = policy
        self.clock = clock or Clock()
        self.replicas = replicas
        self.node = node or f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self.lease_ttl_s = lease_ttl_s
        self.lease_every_s = lease_every_s
        self.limits = limits  # the operator's caps; those over all functions are split by partitions held
        self.retention = retention  # set on the stream at start; what the snapshots must keep ahead of
        self._guard_every_s = guard_every_s
        self.max_backlog = max_backlog
        self.max_behind_s = max_behind_s
        self.backlog = 0  # commands between their arrival here and their decision stored
        self._arrivals: deque[tuple[float, int]] = deque()  # (when, token) of those commands, oldest first
        self._decided: set[int] = set()  # tokens decided but still in `_arrivals` behind an older one
        self.lag_s = 0.0  # how late the event loop runs timers, rising at once and falling slowly
        self.refused = 0  # Assigns refused for overload, since start
        self._store_trouble_at = -1e9  # when an append last failed to reach JetStream (monotonic)
        self._appends_since: dict[int, float] = {}  # appends under way: when each began (monotonic)
        self.ledger = Ledger()
        self.serving: set[int] = set()  # partitions loaded and answered here
        self.loaded_batches = 0  # batches read when partitions were gained, for the ready line
        self.timers = Timers(self.clock, self._tick)
        self.forwarder: Forwarder | None = None  # for calls whose partition another node serves
        self.leases: Leases | None = None
        self.shared: SharedTotals | None = None  # the run's totals across nodes
        self._loading: dict[int, asyncio.Task] = {}
        self._load_error_at = -LOAD_ERROR_EVERY_S  # when a failed load was last logged
        self._subs: dict[int, object] = {}
        self._in_flight: Counter[int] = Counter()  # handles under way, by partition
        self._drained = asyncio.Event()  # set when a partition's handles under way reach none
        self._appending: dict[int, int] = {}  # appends in flight, by the ledger's `seq` when each began
        self._doubtful: dict[str, Batch] = {}  # by function: a batch whose append got no answer (see _settle)
        # One per function with commands under way; gone with the last of them, so an idle function costs none.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._local: dict[str, asyncio.Future[Reply]] = {}  # callers in this process, by their reply_to
        self._tokens = itertools.count()
        self._inbox = ""
        self._tasks: set[asyncio.Task] = set()
        self._lag_watch: asyncio.Task | None = None
        self._store: SnapshotStore | None = None
        self._snapshot_every = snapshot_every
        self._snapshot_interval_s = snapshot_interval_s
        self._unsaved: Counter[int] = Counter()  # events appended since the partition's last snapshot
        self._saved_at: dict[int, float] = {}
        self._saving: dict[int, asyncio.Task] = {}
        self._snap_seq: dict[int, int] = {}  # the watermark of each partition's newest snapshot (0: none)
        self._seen = 0  # the stream's last sequence when last looked at (see _watermark)
        self._first = 0  # ... and its first
        self._guard: asyncio.Task | None = None
        self._retention_set = False  # the stream's limits are ours (see _apply_retention)
        self._stopping = False
        self.snapshot_saved_s: float | None = None  # wall clock of the last snapshot written (metrics)
        self._stream = ""
        self._nc = None
        self._js = None
        self._state_sub = None

    # What tests and tools read; the ledger holds it.
    @property
    def states(self) -> dict[str, FnState]:
        return self.ledger.states

    @property
    def totals(self) -> Totals:
        return self.ledger.totals

    def serves(self, key: str) -> bool:
        return partition(key) in self.serving

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, f"controller {self.node}")
        stream.check_server(self._nc)
        self._js = self._nc.jetstream()
        await ensure_stream(self._js, self.replicas, self.retention)
        await stream.check_layout(self._js)
        self._stream = await stream.stream_id(self._js)
        self._store = SnapshotStore(self._js, self.replicas)
        await self._store.open()
        self._inbox = self._nc.new_inbox()
        await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_answer)
        self.forwarder = Forwarder.over(self._nc)
        await self.forwarder.start()
        self.timers.start()
        self._lag_watch = asyncio.create_task(self._watch_lag())
        self._state_sub = await state_service.serve(self._nc, self.node, self.snapshot)
        self.leases = Leases(
            self._js, self.node, self._gained, self._lost, self.lease_ttl_s, self.lease_every_s, self.replicas
        )
        self.shared = SharedTotals(
            self._js, self.node, self.ledger, self.lease_ttl_s, self.lease_every_s, self.replicas
        )
        await self.shared.start()
        await self.leases.start()
        self._guard = asyncio.create_task(self._keep_ahead())
        if self._loading:  # the first partitions: ready once they are served (a broken stream stops the start)
            await asyncio.gather(*set(self._loading.values()))
        functions, batches = plural(len(self.states), "function"), plural(self.loaded_batches, "batch", "batches")
        return (
            f"controller {self.node} ({self.policy.name} policy, {len(self.serving)} of {PARTITIONS} partitions,"
            f" {functions}, {batches} read)"
        )

    async def stop(self) -> None:
        self._stopping = True  # every partition given back is snapshotted, at the newest watermark
        await cancelled(self._guard)
        await while_connected(self._nc, self._give_back(), "snapshots; its leases lapse")
        await self.timers.stop()
        await cancelled(self._lag_watch)
        if self.forwarder is not None:
            await self.forwarder.stop()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        await close(self._nc)

    async def _give_back(self) -> None:
        with contextlib.suppress(Exception):  # NATS away: the snapshots are as fresh as the last guard made them
            async with asyncio.timeout(1):
                self._seen = max(self._seen, (await rebuild.kept(self._js)).last_seq)
        if self.leases is not None:
            await self.leases.stop()  # gives every partition back, each snapshotted
        if self.shared is not None:
            await self.shared.stop()
        if self._state_sub is not None:
            await self._state_sub.unsubscribe()

    # --- partitions -----------------------------------------------------------------------------

    async def _gained(self, partitions: list[int]) -> None:
        """Leased: load them in the background (the lease round must go on renewing meanwhile)."""
        task = asyncio.create_task(self._load(partitions))
        for p in partitions:
            self._loading[p] = task

    async def _load(self, partitions: list[int]) -> None:
        """Each partition's snapshot, then its batches after it; then serve it."""
        try:
            at = await rebuild.kept(self._js)
            snaps = await rebuild.snapshots(self._store, at, partitions)
            after = rebuild.restore(self.ledger, snaps)
            folded = await rebuild.fold_after(self._js, after, self.ledger.fold)
            self.loaded_batches += folded
            now = asyncio.get_running_loop().time()
            for p in partitions:
                self._snap_seq[p] = after[p]
                if after[p] < at.last_seq:  # a snapshot now spares the next start (or owner) what was just read
                    self._unsaved[p] += 1
                self._subs[p] = await self._nc.subscribe(f"{CMD}.{p}", queue=OWNERS, cb=self._on_request)
                self._saved_at[p] = now
                self.serving.add(p)
            self._share_the_caps()
            for key in self._keys(partitions):
                self.timers.set(key, self.ledger.wake.get(key))
            await self._answer_again(partitions)
        except Exception as e:
            # The lease round takes them again each second: a lasting fault is said once, then every 10 minutes.
            if (now := time.monotonic()) - self._load_error_at >= LOAD_ERROR_EVERY_S:
                self._load_error_at = now
                log.error("could not load partitions %s; giving them back: %s", partitions, e)
            else:
                log.debug("could not load partitions %s; giving them back: %s", partitions, e)
            self._spawn(self._drop(partitions))
            raise
        finally:
            for p in partitions:
                self._loading.pop(p, None)

    async def _lost(self, partitions: list[int]) -> None:
        """Stop serving them: no new command, the ones under way finish, a snapshot, and their state goes.

        Only a partition that was served is snapshotted: one still loading (or that failed to) holds
        no state a snapshot could claim.
        """
        served = [p for p in partitions if p in self.serving]
        for p in partitions:
            if (task := self._loading.pop(p, None)) is not None:
                task.cancel()
            self.serving.discard(p)
            if (sub := self._subs.pop(p, None)) is not None:
                await sub.unsubscribe()
        self._share_the_caps()
        try:
            async with asyncio.timeout(APPEND_TIMEOUT_S * APPEND_ATTEMPTS):
                while any(self._in_flight[p] for p in partitions):
                    self._drained.clear()
                    await self._drained.wait()
        except TimeoutError:  # NATS away: their appends fail on their own, and their snapshot is just older
            log.warning("partitions %s given up with commands still under way", partitions)
        await asyncio.gather(*(self._save(p, force=self._stopping) for p in served))
        self._forget(partitions)

    async def _drop(self, partitions: list[int]) -> None:
        if self.leases is not None:
            await self.leases.give_back(partitions)

    def _forget(self, partitions: list[int]) -> None:
        for key in self._keys(partitions):
            self.timers.set(key, None)
            self.ledger.forget(key)
            self._locks.pop(key, None)
            self._doubtful.pop(key, None)  # the next owner reads the stream: stored or not, it knows
        for p in partitions:
            self._unsaved.pop(p, None)
            self._snap_seq.pop(p, None)
        self._doubtful = {k: b for k, b in self._doubtful.items() if partition(k) not in partitions}

    def _share_the_caps(self) -> None:
        """Caps over all functions, split by partitions held: together the nodes never pass them."""
        self.ledger.limits = (
            self.limits.share(len(self.serving) / PARTITIONS) if self.limits is not NO_LIMITS else NO_LIMITS
        )

    def _keys(self, partitions: list[int]) -> list[str]:
        wanted = set(partitions)
        return [k for k in self.ledger.states if partition(k) in wanted]

    def snapshot(self, partitions: set[int] | None = None) -> Snapshot:
        """A consistent copy of the state (of some partitions): FnState is immutable, so copying is enough."""
        keys = self.ledger.states if partitions is None else self._keys(list(partitions))
        return Snapshot(
            seq=self._watermark(),
            at_ms=self.clock.now_ms(),
            stream=self._stream,
            last_seq={k: self.ledger.last_seq[k] for k in keys if k in self.ledger.last_seq},
            states={k: self.ledger.states[k] for k in keys},
            wake={k: self.ledger.wake[k] for k in keys if k in self.ledger.wake},
        )

    def _watermark(self) -> int:
        """A sequence at or above every batch of our partitions that the state holds, and below every one it lacks.

        The newest we folded or appended, or the stream's last when last looked at, if newer: our
        partitions' batches are all ours, and one appended after that look lands above it; but
        never above an append under way, stored and not yet applied. An idle node's watermark
        thus follows the stream that other nodes fill, and stays ahead of its retention.
        """
        return min(self._appending, default=max(self.ledger.seq, self._seen))

    # --- commands -----------------------------------------------------------------------------

    async def call(self, cmd: Assign | Idle, timeout_s: float | None) -> Reply:
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
                except stream.TooBig as e:
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
        """Refuse a new Assign at once when the node is behind, rather than let every call queue for seconds.

        Only Assigns: an Idle frees an instance (refusing it would only bring it back later), and
        reports and ticks keep the state moving.
        """
        if self._store_slow():
            return None  # not overload: the event store is slow or away, and the call will say so (UNAVAILABLE)
        behind = max(self.behind_s(), self.lag_s)
        if not isinstance(cmd, Assign) or (self.backlog < self.max_backlog and behind < self.max_behind_s):
            return None
        self.refused += 1
        message = (
            f"node {self.node} is overloaded ({self.backlog} commands waiting to be decided, {behind:.1f}s"
            " behind); try again shortly"
        )
        return Reply(to=cmd.reply_to, request_id=cmd.request_id, code=Code.RESOURCE_EXHAUSTED, message=message)

    def _store_slow(self) -> bool:
        """The event store is away or slow: lately an append failed, or one has been under way a second."""
        now = time.monotonic()
        if now - self._store_trouble_at < STORE_TROUBLE_S or not self._nc.is_connected:
            return True
        return bool(self._appends_since) and now - min(self._appends_since.values()) > 1.0

    def behind_s(self) -> float:
        """How long the oldest command not yet decided has been waiting."""
        while self._arrivals and self._arrivals[0][1] in self._decided:
            self._decided.discard(self._arrivals.popleft()[1])
        return time.monotonic() - self._arrivals[0][0] if self._arrivals else 0.0

    async def handle(self, cmd: AnyCommand) -> Decision:
        """Decide one command of one function, append its batch, answer: in the function's arrival order."""
        if isinstance(cmd, Reconcile) and cmd.partition >= 0:
            return await self._reconcile(cmd)
        p = partition(cmd.key)
        if p not in self.serving:
            raise NotServing(f"partition {p} is not served by {self.node}")
        self._in_flight[p] += 1
        self.backlog += 1
        token = next(self._tokens)
        self._arrivals.append((time.monotonic(), token))
        try:
            async with self._locks.setdefault(cmd.key, asyncio.Lock()):
                decision = await self._decide_and_append(cmd, p)
        finally:
            self.backlog -= 1
            self._decided.add(token)
            self._in_flight[p] -= 1
            if not self._in_flight[p]:
                self._drained.set()
        await self._answer(decision.replies)
        return decision

    async def _decide_and_append(self, cmd: AnyCommand, p: int) -> Decision:
        for _ in range(APPEND_ATTEMPTS):
            if p not in self.serving:
                raise NotServing(f"partition {p} was given up")
            await self._settle(cmd.key)
            now = self.clock.now_ms()
            decision = self.ledger.decide(cmd, now, self.policy)
            batch = self.ledger.batch(cmd, decision, now)
            seq = None
            if batch is not None:
                try:
                    seq = await self._write(batch)
                except stream.Conflict:
                    log.warning("conflict on %s: catching up and deciding again", cmd.key)
                    await self._catch_up(cmd.key)
                    continue
                self._maybe_snapshot(p, len(batch.events))
            self.ledger.commit(cmd, decision, seq)
            self.timers.set(cmd.key, self.ledger.wake.get(cmd.key))
            return decision
        raise Unavailable(f"{APPEND_ATTEMPTS} conflicts in a row on {cmd.key!r}")

    async def _write(self, batch: Batch) -> int:
        floor = self.ledger.seq  # a snapshot's watermark stays below this append until it is applied
        self._appending[floor] = self._appending.get(floor, 0) + 1
        token = next(self._tokens)
        self._appends_since[token] = time.monotonic()
        try:
            return await self._append(batch)
        finally:
            del self._appends_since[token]
            self._appending[floor] -= 1
            if not self._appending[floor]:
                del self._appending[floor]

    async def _settle(self, key: str) -> None:
        """Our last append of `key` got no answer, yet may be stored all the same (a stalled NATS, or one that
        got it buffered through a reconnect): append it again first, which stores it or conflicts with it.
        A read alone could not tell: JetStream may answer it before it stores a publish sent earlier."""
        batch = self._doubtful.get(key)
        if batch is None:
            return
        try:
            seq = await self._write(batch)
        except stream.Conflict:
            await self._catch_up(key)
        else:
            self.ledger.fold(seq, batch)
            self.timers.set(key, self.ledger.wake.get(key))
        self._doubtful.pop(key, None)
        await self._answer(self._assignments(key))  # what that batch assigned was never told

    async def _append(self, batch: Batch) -> int:
        """Store the batch if the function's last batch is still the one we know of; returns its sequence.

        The expected sequence also makes a repeated append (ack lost) fail as a conflict, after which
        the catch-up shows the command already applied.
        """
        subject, data = event_subject(batch.key, batch.effects), encode_batch(batch)
        last = self.ledger.last_seq.get(batch.key, 0)
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + APPEND_PATIENCE_S, 0.05
        while True:  # a repeat is safe: if the first was stored after all, this one conflicts
            try:
                return await stream.append(self._nc, subject, data, function_events(batch.key), last, APPEND_TIMEOUT_S)
            except stream.Conflict:
                raise
            except Unavailable:
                self._store_trouble_at = time.monotonic()
                if loop.time() + delay > deadline or partition(batch.key) not in self.serving:
                    self._doubtful[batch.key] = batch  # no answer is not no: it may be stored all the same
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _catch_up(self, key: str) -> None:
        """Fold the function's batches after the last one we hold: another writer, or our own lost ack.

        Or retention dropped the function's last batch (it was idle a long time): its state holds
        it, and the next append expects what the stream still has of the function (nothing).
        """
        try:
            await stream.read(self._js, self.ledger.fold, function_events(key), self.ledger.last_seq.get(key, 0))
            stored = await stream.last_seq(self._js, function_events(key))
        except (NatsError, TimeoutError) as e:
            raise Unavailable(f"event store unavailable: {type(e).__name__}") from e
        if stored < self.ledger.last_seq.get(key, 0):
            self.ledger.expire(key, stored)

    async def _reconcile(self, cmd: Reconcile) -> Decision:
        """The platform's list for one partition, put to each of its functions in turn (those the list names
        and those it doesn't), each deciding alone, so a repeat after a crash half-way repeats only no-ops."""
        if cmd.partition not in self.serving:
            raise NotServing(f"partition {cmd.partition} is not served by {self.node}")
        known = self._keys([cmd.partition])
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
            except stream.TooBig as e:
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
            lag = loop.time() - began - every_s
            self.lag_s = lag if lag > self.lag_s else 0.9 * self.lag_s + 0.1 * lag

    async def _tick(self, key: str, due_ms: int) -> None:
        if self.serves(key):
            try:
                await self.handle(Tick(key=key, due_ms=due_ms))
            except stream.TooBig as e:  # deciding it again would only fail again: the next command tries
                log.error("%s: the deadline's decision cannot be stored: %s", key, e)

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
        is_call = isinstance(cmd, Assign | Idle | SlotCreated)
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
        except stream.TooBig as e:  # refused once: sending it again would fail again
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
        for key in self._keys(partitions):
            await self._answer(self._assignments(key))

    def _assignments(self, key: str) -> list[Reply]:
        """The answer of every request an instance of `key` serves, to each of its callers."""
        busy = [i for i in self.ledger.state(key).instances.values() if i.phase is Phase.BUSY]
        return [Reply(to=to, request_id=i.request_id, instance_id=i.id) for i in busy for to in i.waiters]

    # --- snapshots and tasks ------------------------------------------------------------------

    async def _keep_ahead(self) -> None:
        """Every second: snapshot the partitions whose snapshot retention is about to overtake (see _due)."""
        while True:
            await asyncio.sleep(self._guard_every_s)
            try:
                at = await rebuild.kept(self._js)
            except Exception:  # NATS away: nothing is appended or dropped meanwhile either
                continue
            self._seen = max(self._seen, at.last_seq)
            if not self._retention_set:
                with contextlib.suppress(Exception):  # tried again at the next look
                    await self._apply_retention(at)
            if at.first_seq > self._first:  # functions whose every batch is gone: no order check to keep
                self._first = at.first_seq
                self.ledger.expire_before(at.first_seq)
            now = asyncio.get_running_loop().time()
            for p in sorted(self.serving):
                saving = self._saving.get(p)
                if (saving is None or saving.done()) and self._due(p, at, now):
                    self._saving[p] = asyncio.create_task(self._save(p, force=True))

    async def _apply_retention(self, at: rebuild.Kept) -> None:
        """Bring the stream's limits to ours once every partition has a snapshot this version reads, in the newer
        half of what is kept. Lower limits drop old batches at once, and until then a partition without such a
        snapshot (an upgrade that changed the state's shape, a stream older than retention) needs them all."""
        if retention_of((await self._js.stream_info(EVENTS)).config) != self.retention:
            snaps = await asyncio.gather(*(self._store.load(p, at.stream_id, at.last_seq) for p in range(PARTITIONS)))
            newer_half = at.first_seq + (at.last_seq - at.first_seq) // 2
            if not all(snap is not None and snap.seq >= newer_half for snap in snaps):
                return
            await set_retention(self._js, self.retention)
            log.info("EVENTS now keeps %gh and %g GB", self.retention.max_age_s / 3600, self.retention.max_bytes / 1e9)
        self._retention_set = True

    def _due(self, p: int, at: rebuild.Kept, now: float) -> bool:
        """Events unsaved for the snapshot interval (a partition that went quiet), or a snapshot in the older
        half of what the stream keeps or older than a quarter of its age, which a newer watermark would help."""
        saved_at = self._saved_at.get(p, now)
        if self._unsaved[p] and now - saved_at >= self._snapshot_interval_s:
            return True
        if self._watermark() <= self._snap_seq.get(p, 0):
            return False
        older_half = self._snap_seq.get(p, 0) < at.first_seq + (at.last_seq - at.first_seq) // 2
        return older_half or now - saved_at >= self.retention.max_age_s / 4

    def _maybe_snapshot(self, p: int, events: int) -> None:
        self._unsaved[p] += events
        if (saving := self._saving.get(p)) is not None and not saving.done():
            return
        now = asyncio.get_running_loop().time()
        if self._unsaved[p] >= self._snapshot_every or now - self._saved_at.get(p, now) >= self._snapshot_interval_s:
            self._saving[p] = asyncio.create_task(self._save(p))

    async def _save(self, p: int, force: bool = False) -> None:
        """Snapshot one partition (after the one being written, if any), if it changed or `force`."""
        if (saving := self._saving.get(p)) is not None and saving is not asyncio.current_task():
            await asyncio.shield(saving)
        if not self._unsaved[p] and not force:
            return
        self._unsaved[p], self._saved_at[p] = 0, asyncio.get_running_loop().time()
        snap = self.snapshot({p})
        try:
            size = await self._store.save(p, snap)
            self._snap_seq[p] = max(self._snap_seq.get(p, 0), snap.seq)
            self.snapshot_saved_s = time.time()
            log.debug("snapshot of partition %d at seq %d: %d functions, %d bytes", p, snap.seq, len(snap.states), size)
        except Exception as e:  # a snapshot is an optimisation: never let it stop command handling
            log.warning("could not write the snapshot of partition %d: %s", p, e)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _unstorable(cmd: AnyCommand, to: str, e: stream.TooBig) -> Reply:
    """The answer to a command whose decision no NATS message can hold: refused, not to be tried again."""
    log.error("%s refused: its decision cannot be stored: %s", command_id(cmd), e)
    message = f"the decision cannot be stored: {e}"
    return Reply(to=to, request_id=getattr(cmd, "request_id", ""), code=Code.INTERNAL, message=message)
