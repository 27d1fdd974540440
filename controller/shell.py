"""The controller's I/O: the single writer of the functions it owns.

For each command it reads the clock once, asks the pure core (through the ledger), appends the
resulting batch to the function's subjects with the expected last sequence of the function (so
a second writer fails instead of corrupting the stream), and only then answers. Commands of one
function are decided in arrival order under its lock; different functions proceed concurrently.

Commands come three ways: `call` from the gateway in the same process (the hot path: no NATS hop
but the append), core NATS requests on `cmd.<partition>` (front gateways and the workers'
reports), and the controller's own timers (Tick, when a function's deadline is due).
"""

import asyncio
import itertools
import logging
import secrets
import time
from pathlib import Path

from msgspec.structs import replace
from nats.aio.msg import Msg

from controller import state_service, stream
from controller.core import reconcile
from controller.core.decide import Decision
from controller.core.policy import Policy
from controller.core.state import FnState, Phase, Totals
from controller.ledger import Ledger
from controller.snapshots import Snapshot, SnapshotStore
from controller.timers import Timers
from proto.commands import (
    AnyCommand,
    Assign,
    Cancel,
    Code,
    Idle,
    Reconcile,
    Reply,
    Tick,
    command_id,
    decode_command,
    encode,
)
from proto.events import Batch, encode_batch
from proto.subjects import CMD, PARTITIONS, event_subject, function_events, partition
from runtime.bus import Unavailable, close, connect, ensure_stream
from runtime.clock import Clock
from runtime.text import plural

log = logging.getLogger("scaler.controller")

APPEND_ATTEMPTS = 3
APPEND_TIMEOUT_S = 5.0
CANCEL_PATIENCE_S = 120.0  # how long a Cancel is retried through an outage of the event store
SNAPSHOT_EVERY = 10_000  # events
SNAPSHOT_INTERVAL_S = 60.0
LOCAL = "_L."  # reply_to of callers in the controller's own process (`call`): never a NATS subject


class Controller:
    def __init__(
        self,
        nats_url: str,
        policy: Policy,
        clock: Clock | None = None,
        snapshots: str | Path | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
    ) -> None:
        self.nats_url = nats_url
        self.policy = policy
        self.clock = clock or Clock()
        self.ledger = Ledger()
        self.rebuilt_from = 0  # the snapshot's sequence the last rebuild started from (0: the whole stream)
        self.timers = Timers(self.clock, self._tick)
        self._appending: dict[int, int] = {}  # appends in flight, by the ledger's `seq` when each began
        self._locks: dict[str, asyncio.Lock] = {}
        self._local: dict[str, asyncio.Future[Reply]] = {}  # callers in this process, by their reply_to
        self._prefix = f"{LOCAL}{secrets.token_hex(4)}."  # this process's callers: a restart's are new ones
        self._tokens = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._store = SnapshotStore(snapshots) if snapshots else None
        self._snapshot_every = snapshot_every
        self._snapshot_interval_s = snapshot_interval_s
        self._unsaved = 0  # events appended since the last snapshot
        self._saved_at = 0.0
        self._saving: asyncio.Task | None = None
        self.snapshot_saved_s: float | None = None  # wall clock of the last snapshot written (metrics)
        self._stream = ""
        self._nc = None
        self._js = None
        self._subs: list = []
        self._state_sub = None

    # What tests and tools read; the ledger holds it.
    @property
    def states(self) -> dict[str, FnState]:
        return self.ledger.states

    @property
    def totals(self) -> Totals:
        return self.ledger.totals

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, "controller")
        self._js = self._nc.jetstream()
        await ensure_stream(self._js)
        await stream.check_layout(self._js)
        if self._store is not None:
            await self._store.open()
        count = await self.rebuild()
        for key, wake_ms in self.ledger.wake.items():
            self.timers.set(key, wake_ms)
        self.timers.start()
        self._subs = [await self._nc.subscribe(f"{CMD}.{p}", cb=self._on_request) for p in range(PARTITIONS)]
        self._state_sub = await state_service.serve(self._nc, self.snapshot)
        await self._answer_again()
        self._saved_at = asyncio.get_running_loop().time()
        start = f"snapshot at seq {self.rebuilt_from} + " if self.rebuilt_from else ""
        functions, batches = plural(len(self.states), "function"), plural(count, "batch", "batches")
        return f"controller ({self.policy.name} policy, {functions} from {start}{batches})"

    async def stop(self) -> None:
        for sub in [*self._subs, self._state_sub]:
            if sub is not None:
                await sub.unsubscribe()
        await self.timers.stop()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        if self._store is not None:
            if self._saving is not None:
                await self._saving
            if self._unsaved:
                await self._save(self.snapshot())
            await self._store.close()
        await close(self._nc)

    async def rebuild(self) -> int:
        """Load the newest usable snapshot, then fold the batches after it. Returns the number of batches read."""
        self.ledger = Ledger()
        self.rebuilt_from = 0
        self._stream = await stream.stream_id(self._js)
        if self._store is not None:
            snap = await self._store.load(self._stream, await stream.last_seq(self._js))
            if snap is not None:
                self.ledger.restore(snap.states, snap.last_seq, snap.wake, snap.seq)
                self.rebuilt_from = snap.seq
        return await stream.read(self._js, self.ledger.fold, after_seq=self.rebuilt_from)

    def snapshot(self) -> Snapshot:
        """A consistent copy of the state: FnState is immutable, so copying the dicts is enough."""
        watermark = min(self._appending, default=self.ledger.seq)
        return Snapshot(
            seq=watermark,
            stream=self._stream,
            last_seq=dict(self.ledger.last_seq),
            states=dict(self.ledger.states),
            wake=dict(self.ledger.wake),
        )

    # --- commands -----------------------------------------------------------------------------

    async def call(self, cmd: Assign | Idle, timeout_s: float | None) -> Reply:
        """Decide a call from this process and wait for its answer (an Assign may wait for an instance).

        An Assign whose caller stops waiting (timeout, cancellation, or the event store away when
        its outcome is unknown) is cancelled in the background, so a stored request never holds
        an instance for nobody.
        """
        to = f"{self._prefix}{next(self._tokens)}"
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._local[to] = answer
        cmd = replace(cmd, reply_to=to)
        try:
            async with asyncio.timeout(timeout_s):
                await self.handle(cmd)
                return await answer
        except (TimeoutError, asyncio.CancelledError, Unavailable) as e:
            if isinstance(cmd, Assign):
                why = {TimeoutError: "no answer in time", Unavailable: "event store unavailable"}
                self._give_up(cmd, why.get(type(e), "caller disconnected"))
            raise
        finally:
            del self._local[to]

    async def handle(self, cmd: AnyCommand) -> Decision:
        """Decide one command of one function, append its batch, answer: in the function's arrival order."""
        if isinstance(cmd, Reconcile) and cmd.partition >= 0:
            return await self._reconcile(cmd)
        async with self._locks.setdefault(cmd.key, asyncio.Lock()):
            decision = await self._decide_and_append(cmd)
        await self._answer(decision.replies)
        return decision

    async def _decide_and_append(self, cmd: AnyCommand) -> Decision:
        for _ in range(APPEND_ATTEMPTS):
            now = self.clock.now_ms()
            decision = self.ledger.decide(cmd, now, self.policy)
            batch = self.ledger.batch(cmd, decision, now)
            seq = None
            if batch is not None:
                floor = self.ledger.seq  # a snapshot's watermark stays below this append until it is applied
                self._appending[floor] = self._appending.get(floor, 0) + 1
                try:
                    seq = await self._append(batch)
                except stream.Conflict:
                    log.warning("conflict on %s: catching up and deciding again", cmd.key)
                    await self._catch_up(cmd.key)
                    continue
                finally:
                    self._appending[floor] -= 1
                    if not self._appending[floor]:
                        del self._appending[floor]
                self._maybe_snapshot(len(batch.events))
            self.ledger.commit(cmd, decision, seq)
            self.timers.set(cmd.key, self.ledger.wake.get(cmd.key))
            return decision
        raise Unavailable(f"{APPEND_ATTEMPTS} conflicts in a row on {cmd.key!r}")

    async def _append(self, batch: Batch) -> int:
        """Store the batch if the function's last batch is still the one we know of; returns its sequence.

        The expected sequence also makes a repeated append (ack lost) fail as a conflict, after which
        the catch-up shows the command already applied.
        """
        subject = event_subject(batch.key, batch.effects)
        last = self.ledger.last_seq.get(batch.key, 0)
        return await stream.append(
            self._nc, subject, encode_batch(batch), function_events(batch.key), last, APPEND_TIMEOUT_S
        )

    async def _catch_up(self, key: str) -> None:
        """Fold one function again from its own batches, after another writer (or a lost ack) moved it on."""
        self.ledger.forget(key)
        await stream.read(self._js, self.ledger.fold, subject=function_events(key))

    async def _reconcile(self, cmd: Reconcile) -> Decision:
        """The platform's list for one partition, put to each of its functions in turn (those the list names
        and those it doesn't), each deciding alone, so a repeat after a crash half-way repeats only no-ops."""
        known = [k for k in self.ledger.states if partition(k) == cmd.partition]
        for key, slots in reconcile.by_function(cmd.slots, known).items():
            await self.handle(replace(cmd, key=key, slots=slots, partition=-1))
        log.info("reconciled partition %d: %d functions, %d platform slots", cmd.partition, len(known), len(cmd.slots))
        return Decision([], [], self.ledger.state(cmd.key), None)

    async def _answer(self, replies: list[Reply]) -> None:
        for reply in replies:
            waiter = self._local.get(reply.to)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(reply)
            elif not reply.to.startswith(LOCAL):  # a caller of another process, waiting on NATS
                await self._nc.publish(reply.to, encode(reply))
            # else a caller of this process (or a previous one) that stopped waiting

    def _give_up(self, cmd: Assign, why: str) -> None:
        cancel = Cancel(key=cmd.key, request_id=cmd.request_id, reply_to=cmd.reply_to, reason=why)
        self._spawn(self._cancel(cancel))

    async def _cancel(self, cancel: Cancel) -> None:
        """Cancel through an outage of the event store: the Assign may have been stored all the same."""
        deadline = asyncio.get_running_loop().time() + CANCEL_PATIENCE_S
        delay = 0.05
        while True:
            try:
                await self.handle(cancel)
                return
            except Unavailable as e:
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("could not cancel %s: %s", cancel.request_id, e)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _tick(self, key: str, due_ms: int) -> None:
        await self.handle(Tick(key=key, due_ms=due_ms))

    async def _on_request(self, msg: Msg) -> None:
        """A command from another process: a front gateway's call, or a worker's report."""
        try:
            cmd = decode_command(msg.data)
        except Exception as e:
            log.error("refusing an unreadable command on %s: %s", msg.subject, e)
            if msg.reply:
                await msg.respond(
                    encode(Reply(to=msg.reply, request_id="", code=Code.INVALID_ARGUMENT, message=str(e)))
                )
            return
        self._spawn(self._serve(cmd, msg))

    async def _serve(self, cmd: AnyCommand, msg: Msg) -> None:
        """Calls are answered by their decision (now or, for a waiting Assign, later); reports once stored."""
        is_call = isinstance(cmd, Assign | Idle)
        if is_call:
            cmd = replace(cmd, reply_to=msg.reply)
        try:
            await self.handle(cmd)
        except Unavailable as e:  # the sender tries again
            log.warning("could not handle %s: %s", command_id(cmd), e)
            if is_call and msg.reply:
                reply = Reply(to=msg.reply, request_id=cmd.request_id, code=Code.UNAVAILABLE, message=str(e))
                await self._nc.publish(msg.reply, encode(reply))
            return
        if not is_call and msg.reply:
            await self._nc.publish(msg.reply, encode(Reply(to=msg.reply, request_id=command_id(cmd))))

    async def _answer_again(self) -> None:
        """Send every busy instance's assignment once more to callers waiting on NATS.

        An answer goes out after its batch is stored: a controller killed in between stored the
        assignment but never told the caller, and a retried call finds it already done. A caller
        that has its answer ignores the copy. Callers of a dead process are gone with it.
        """
        for s in self.states.values():
            for inst in s.instances.values():
                if inst.phase is Phase.BUSY:
                    for to in inst.waiters:
                        if not to.startswith(LOCAL):
                            reply = Reply(to=to, request_id=inst.request_id, instance_id=inst.id)
                            await self._nc.publish(to, encode(reply))

    # --- snapshots and tasks ------------------------------------------------------------------

    def _maybe_snapshot(self, events: int) -> None:
        self._unsaved += events
        if self._store is None or (self._saving is not None and not self._saving.done()):
            return
        now = asyncio.get_running_loop().time()
        if self._unsaved >= self._snapshot_every or now - self._saved_at >= self._snapshot_interval_s:
            self._unsaved, self._saved_at = 0, now
            self._saving = asyncio.create_task(self._save(self.snapshot()))

    async def _save(self, snap: Snapshot) -> None:
        try:
            size = await self._store.save(snap)
            self.snapshot_saved_s = time.time()
            log.info("snapshot at seq %d: %d functions, %d bytes", snap.seq, len(snap.states), size)
        except Exception as e:  # a snapshot is an optimisation: never let it stop command handling
            log.warning("could not write a snapshot: %s", e)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
