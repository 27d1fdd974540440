"""The controller's I/O: commands in from JetStream, decisions appended to EVENTS, replies out.

The single writer of events. For each command it reads the clock once, asks the pure core,
appends the resulting batch with the expected last sequence of the function's subject (so a
second writer fails instead of corrupting the stream), then replies and acks. Commands of one
function are handled in arrival order; different functions proceed concurrently.
"""

import asyncio
import logging

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError

from controller.core.decide import Decision, decide
from controller.core.policy import Policy
from controller.core.state import FnState, apply
from proto.commands import AnyCommand, Tick, command_id, decode_command, encode
from proto.events import Batch, decode_batch, encode_batch
from proto.subjects import COMMANDS, EVENTS, EVT, event_subject
from scaler.bus import close, connect, ensure_streams
from scaler.clock import Clock

log = logging.getLogger("scaler.controller")

DURABLE = "controller"
WRONG_LAST_SEQUENCE = 10071
APPEND_ATTEMPTS = 3


class Conflict(Exception):
    """Someone else appended to the function's subject since we last read it."""


class Controller:
    def __init__(self, nats_url: str, policy: Policy, clock: Clock | None = None) -> None:
        self.nats_url = nats_url
        self.policy = policy
        self.clock = clock or Clock()
        self.states: dict[str, FnState] = {}
        self.last_seq: dict[str, int] = {}  # per function: stream sequence of its last batch
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()
        self._nc = None
        self._js = None
        self._sub = None

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, "controller")
        self._js = self._nc.jetstream()
        await ensure_streams(self._js)
        count = await self.rebuild()
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=20_000)
        try:
            self._sub = await self._js.subscribe(
                "cmd.>", durable=DURABLE, stream=COMMANDS, cb=self._on_command, manual_ack=True, config=config
            )
        except Exception as e:
            raise RuntimeError(f"cannot consume commands ({e}); is another controller running?") from e
        return f"controller ({self.policy.name} policy, {len(self.states)} functions from {count} batches)"

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        await close(self._nc)

    async def rebuild(self) -> int:
        """Fold the whole EVENTS stream into state. Returns the number of batches read."""
        self.states.clear()
        self.last_seq.clear()
        return await self._fold(f"{EVT}.>")

    async def _fold(self, subject: str) -> int:
        info = await self._js.stream_info(EVENTS)
        if info.state.messages == 0:
            return 0
        done = asyncio.get_running_loop().create_future()
        count = 0

        async def on_batch(msg: Msg) -> None:
            nonlocal count
            batch = decode_batch(msg.data)
            s = self.states.get(batch.key) or FnState(key=batch.key)
            for event in batch.events:
                s = apply(s, event)
            self.states[batch.key] = s
            self.last_seq[batch.key] = msg.metadata.sequence.stream
            count += 1
            if msg.metadata.num_pending == 0 and not done.done():
                done.set_result(None)

        sub = await self._js.subscribe(subject, stream=EVENTS, ordered_consumer=True, cb=on_batch)
        try:
            # Nothing on this subject at all: the consumer delivers nothing, so don't wait forever.
            probe = await sub.consumer_info()
            if probe.num_pending == 0 and probe.delivered.stream_seq == 0:
                return 0
            await done
        finally:
            await sub.unsubscribe()
        return count

    async def _reload(self, key: str) -> None:
        """Catch one function up from its subject after a conflict."""
        self.states.pop(key, None)
        self.last_seq.pop(key, None)
        await self._fold(event_subject(key))

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
        lock = self._locks.setdefault(cmd.key, asyncio.Lock())
        async with lock:
            try:
                decision = await self._decide_and_append(cmd)
            except Exception:
                log.exception("could not handle %s; it will be redelivered", command_id(cmd))
                await msg.nak(delay=1)
                return
            for reply in decision.replies:
                await self._nc.publish(reply.to, encode(reply))
            await msg.ack()

    async def _decide_and_append(self, cmd: AnyCommand) -> Decision:
        for _ in range(APPEND_ATTEMPTS):
            now = self.clock.now_ms()
            s = self.states.get(cmd.key) or FnState(key=cmd.key)
            decision = decide(s, cmd, now, self.policy)
            # A Tick that found nothing due yet still re-arms the gc worker's timer.
            rearm = isinstance(cmd, Tick) and decision.wake_ms is not None
            if decision.events or rearm:
                batch = Batch(
                    key=cmd.key, at_ms=now, cause=command_id(cmd), events=decision.events, wake_ms=decision.wake_ms
                )
                try:
                    self.last_seq[cmd.key] = await self._append(batch)
                except Conflict:
                    log.warning("conflict on %s: catching up and deciding again", cmd.key)
                    await self._reload(cmd.key)
                    continue
            self.states[cmd.key] = decision.state
            return decision
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
