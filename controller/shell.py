"""The controller's I/O: commands in from JetStream, decisions appended to EVENTS, replies out.

The single writer of events. For each command it reads the clock once, asks the pure core,
appends the resulting batch with the expected last sequence of the function's subject (so a
second writer fails instead of corrupting the stream), then replies and acks. Commands of one
function are handled in arrival order; different functions proceed concurrently.
"""

import asyncio
import logging
from collections import Counter
from pathlib import Path

from msgspec.structs import replace
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError, NotFoundError

from controller import state_service, stream
from controller.core import reconcile
from controller.core.decide import Decision, decide
from controller.core.policy import Policy
from controller.core.state import FnState, Phase, Totals, apply
from controller.snapshots import Snapshot, SnapshotStore
from proto.commands import AnyCommand, Reconcile, Reply, Tick, command_id, decode_command, encode
from proto.events import Batch, encode_batch
from proto.subjects import COMMANDS, SYSTEM_KEY, event_subject
from runtime.bus import close, connect, ensure_streams
from runtime.clock import Clock

log = logging.getLogger("scaler.controller")

DURABLE = "controller"
WRONG_LAST_SEQUENCE = 10071
APPEND_ATTEMPTS = 3
ACK_WAIT_S = 10  # a command delivered but lost in a NATS outage comes back after this
SNAPSHOT_EVERY = 10_000  # events
SNAPSHOT_INTERVAL_S = 60.0


class Conflict(Exception):
    """Someone else appended to the function's subject since we last read it."""


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
        self.states: dict[str, FnState] = {}
        self.totals = Totals()  # the run so far, summed over functions, for the policy
        self.last_seq: dict[str, int] = {}  # per function: stream sequence of its last batch
        self.applied_seq = 0  # the newest stream sequence known: any append still to come gets a higher one
        self.rebuilt_from = 0  # the snapshot's sequence the last rebuild started from (0: the whole stream)
        self._appending: Counter[int] = Counter()  # appends in flight, by `applied_seq` when each began
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self._store = SnapshotStore(snapshots) if snapshots else None
        self._snapshot_every = snapshot_every
        self._snapshot_interval_s = snapshot_interval_s
        self._unsaved = 0  # events appended since the last snapshot
        self._saved_at = 0.0
        self._saving: asyncio.Task | None = None
        self._stream = ""
        self._nc = None
        self._js = None
        self._sub = None
        self._state_sub = None

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, "controller", reconnected=self._on_reconnect)
        self._js = self._nc.jetstream()
        await ensure_streams(self._js)
        if self._store is not None:
            await self._store.open()
        count = await self.rebuild()
        await self._redeliver_unacked()
        try:
            self._sub = await self._consume()
        except Exception as e:
            raise RuntimeError(f"cannot consume commands ({e}); is another controller running?") from e
        self._state_sub = await state_service.serve(self._nc, self.snapshot)
        await self._answer_again()
        self._saved_at = asyncio.get_running_loop().time()
        start = f"snapshot at seq {self.rebuilt_from} + " if self.rebuilt_from else ""
        return f"controller ({self.policy.name} policy, {len(self.states)} functions from {start}{count} batches)"

    async def stop(self) -> None:
        if self._state_sub is not None:
            await self._state_sub.unsubscribe()
        if self._sub is not None:
            await self._sub.unsubscribe()
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
        self.states.clear()
        self.totals = Totals()
        self.last_seq.clear()
        self.applied_seq = self.rebuilt_from = 0
        self._stream = await stream.stream_id(self._js)
        if self._store is not None:
            snap = await self._store.load(self._stream, await stream.last_seq(self._js))
            if snap is not None:
                for key, state in snap.states.items():
                    self._put_state(key, state)
                self.last_seq.update(snap.last_seq)
                self.applied_seq = self.rebuilt_from = snap.seq
        return await stream.read(self._js, self._fold, after_seq=self.rebuilt_from)

    def _fold(self, seq: int, batch: Batch) -> None:
        self.applied_seq = max(self.applied_seq, seq)
        if seq <= self.last_seq.get(batch.key, 0):
            return  # already in the snapshot's state
        s = self.states.get(batch.key) or FnState(key=batch.key)
        for event in batch.events:
            s = apply(s, event)
        self._put_state(batch.key, s)
        self.last_seq[batch.key] = seq

    def _put_state(self, key: str, s: FnState) -> None:
        self.totals = self.totals.change(self.states.get(key), s)
        self.states[key] = s

    def snapshot(self) -> Snapshot:
        """A consistent copy of the state: FnState is immutable, so copying the dicts is enough."""
        watermark = min(self._appending, default=self.applied_seq)
        return Snapshot(seq=watermark, stream=self._stream, last_seq=dict(self.last_seq), states=dict(self.states))

    async def _redeliver_unacked(self) -> None:
        """Have commands a crashed controller received but never acked delivered now, not after ack_wait.

        COMMANDS is a work queue: what it still holds is exactly what no controller acked. An
        unbound durable consumer redelivers its unacked messages only after ack_wait; a new
        consumer delivers them at once. A bound one means another controller is running.
        """
        try:
            info = await self._js.consumer_info(COMMANDS, DURABLE)
        except NotFoundError:
            return
        if info.push_bound:
            raise RuntimeError("another controller is consuming commands")
        if info.num_ack_pending:
            log.info("%d commands were in flight when the last controller stopped", info.num_ack_pending)
            await self._js.delete_consumer(COMMANDS, DURABLE)

    async def _consume(self):
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S, max_ack_pending=20_000)
        return await self._js.subscribe(
            "cmd.>", durable=DURABLE, stream=COMMANDS, cb=self._on_command, manual_ack=True, config=config
        )

    async def _on_reconnect(self) -> None:
        """After a NATS outage, get at once the commands whose delivery or ack the outage lost.

        They would otherwise come back only after ack_wait, while their callers wait. A new
        consumer on the work queue delivers every unacked command now; the ones still being
        handled here come twice, which deciding again turns into no-ops.
        """
        if self._sub is None:
            return
        old, self._sub = self._sub, None
        for attempt in range(20):  # JetStream may need a moment after a server restart
            try:
                await old.unsubscribe()
            except Exception:
                pass
            try:
                await self._js.delete_consumer(COMMANDS, DURABLE)
            except NotFoundError:
                pass
            except Exception as e:
                log.info("after reconnecting: %s; retrying", e)
                await asyncio.sleep(0.25 * (attempt + 1))
                continue
            try:
                self._sub = await self._consume()
                log.info("reconnected: consuming commands again")
                return
            except Exception as e:
                log.info("after reconnecting: %s; retrying", e)
                await asyncio.sleep(0.25 * (attempt + 1))
        log.error("could not consume commands again after reconnecting; restart the controller")

    async def _answer_again(self) -> None:
        """Send every busy instance's assignment to its callers once more.

        A reply is sent after its batch is appended: a controller killed in between appended the
        assignment but never told the caller, and the redelivered command finds nothing left to
        do. A caller that already has its answer ignores the copy (each call has its own inbox).
        """
        for s in self.states.values():
            for inst in s.instances.values():
                if inst.phase is Phase.BUSY:
                    for to in inst.waiters:
                        reply = Reply(to=to, request_id=inst.request_id, instance_id=inst.id)
                        await self._nc.publish(to, encode(reply))

    async def _reload(self, key: str) -> None:
        """Catch one function up from its subject after a conflict."""
        self.totals = self.totals.change(self.states.pop(key, None), None)
        self.last_seq.pop(key, None)
        await stream.read(self._js, self._fold, subject=event_subject(key))

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
            log.info("snapshot at seq %d: %d functions, %d bytes", snap.seq, len(snap.states), size)
        except Exception as e:  # a snapshot is an optimisation: never let it stop command handling
            log.warning("could not write a snapshot: %s", e)

    async def _on_command(self, msg: Msg) -> None:
        try:
            cmd = decode_command(msg.data)
        except Exception as e:
            log.error("dropping unreadable command on %s: %s", msg.subject, e)
            await msg.term()
            return
        task = asyncio.create_task(self._handle(cmd, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, cmd: AnyCommand, msg: Msg) -> None:
        try:
            if isinstance(cmd, Reconcile) and cmd.key == SYSTEM_KEY:
                await self._reconcile(cmd)
            else:
                await self._settle(cmd)
        except Exception:
            log.exception("could not handle %s; it will be redelivered", command_id(cmd))
            await msg.nak(delay=1)
            return
        await msg.ack()

    async def _settle(self, cmd: AnyCommand) -> None:
        """Decide one command of one function, append, reply: in the function's arrival order."""
        async with self._locks.setdefault(cmd.key, asyncio.Lock()):
            decision = await self._decide_and_append(cmd)
            for reply in decision.replies:
                await self._nc.publish(reply.to, encode(reply))

    async def _reconcile(self, cmd: Reconcile) -> None:
        """The platform's list, put to every function's core in turn, then the slots none of them claims.

        Each function decides alone, so a redelivery after a crash half-way repeats only no-ops.
        """
        for key in [k for k in self.states if k != SYSTEM_KEY]:
            await self._settle(replace(cmd, key=key))
        orphans = reconcile.unclaimed(self.states.values(), cmd.slots)
        await self._settle(replace(cmd, key=SYSTEM_KEY, slots=orphans))
        log.info("reconciled %d functions with %d platform slots", len(self.states), len(cmd.slots))

    async def _decide_and_append(self, cmd: AnyCommand) -> Decision:
        for _ in range(APPEND_ATTEMPTS):
            now = self.clock.now_ms()
            s = self.states.get(cmd.key) or FnState(key=cmd.key)
            decision = decide(s, cmd, now, self.policy, self.totals)
            # A Tick that found nothing due yet still re-arms the gc worker's timer.
            rearm = isinstance(cmd, Tick) and decision.wake_ms is not None
            if decision.events or rearm:
                batch = Batch(
                    key=cmd.key, at_ms=now, cause=command_id(cmd), events=decision.events, wake_ms=decision.wake_ms
                )
                floor = self.applied_seq
                self._appending[floor] += 1
                try:
                    seq = await self._append(batch)
                except Conflict:
                    log.warning("conflict on %s: catching up and deciding again", cmd.key)
                    await self._reload(cmd.key)
                    continue
                finally:
                    self._appending[floor] -= 1
                    if not self._appending[floor]:
                        del self._appending[floor]
                self.last_seq[cmd.key] = seq
                self.applied_seq = max(self.applied_seq, seq)
                self._put_state(cmd.key, decision.state)
                self._maybe_snapshot(len(decision.events))
            return decision  # no events: nothing changed, and a function with no batch has no state
        raise RuntimeError(f"{APPEND_ATTEMPTS} conflicts in a row on {cmd.key}")

    async def _append(self, batch: Batch) -> int:
        # The expected sequence also makes a repeated append (ack lost, command redelivered) fail
        # as a conflict, after which the catch-up shows the command already applied.
        headers = {"Nats-Expected-Last-Subject-Sequence": str(self.last_seq.get(batch.key, 0))}
        try:
            ack = await self._js.publish(event_subject(batch.key), encode_batch(batch), headers=headers)
        except APIError as e:
            if e.err_code == WRONG_LAST_SEQUENCE:
                raise Conflict(batch.key) from e
            raise
        return ack.seq
