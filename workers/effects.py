"""What the two effect executors share: react to chosen events, call the platform, report back.

Each worker has a durable consumer on the EVENTS stream, so an event is acted on at least once:
the batch is acked only after every outcome it caused was reported. The platform calls are
made idempotent by request ids derived from the instance (a retried CreateSlot asks for the
same slot), and the controller ignores repeated reports.
"""

import asyncio
import logging
from typing import ClassVar

import grpc
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from proto import serverless_sim_pb2_grpc as pb_grpc
from proto.commands import AnyCommand
from proto.events import Event, decode_batch
from proto.subjects import EVENTS, EVT
from runtime.bus import close, connect, ensure_streams, publish_command

log = logging.getLogger("scaler.effects")

TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})
CALL_TIMEOUT_S = 120.0
# An event a crashed worker was performing is redelivered after ACK_WAIT_S: kept short so a
# restarted worker resumes in seconds, while a long platform call in a live worker tells the
# server every PROGRESS_S that it is still at work.
ACK_WAIT_S = 10
PROGRESS_S = 3


class PlatformError(Exception):
    """A platform call failed for good; the message says which call and why."""


async def call_platform(method, request, what: str, attempts: int = 5):
    """Call a Platform RPC, retrying transient gRPC failures with backoff."""
    for n in range(attempts):
        try:
            return await method(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            if e.code() not in TRANSIENT or n == attempts - 1:
                raise PlatformError(f"{what}: {e.code().name}: {e.details()}") from None
            await asyncio.sleep(0.05 * 2**n)
    raise AssertionError("unreachable")


async def _working_on(msg: Msg) -> None:
    """Keep a message from being redelivered while this live worker is still performing it."""
    while True:
        await asyncio.sleep(PROGRESS_S)
        try:
            await msg.in_progress()
        except Exception as e:  # NATS away: the ack after the outage settles it, or ack_wait will
            log.debug("could not extend %s: %s", msg.reply, e)


class EffectWorker:
    """Base of the platform and gc workers: `wants` picks events, `act` performs one and returns its report."""

    durable: ClassVar[str]
    name: ClassVar[str]

    def __init__(self, nats_url: str, platform: str, concurrency: int = 1024) -> None:
        self.nats_url = nats_url
        self.platform_addr = platform
        self._limit = asyncio.Semaphore(concurrency)
        self._max_pending = concurrency * 4
        self._tasks: set[asyncio.Task] = set()
        self._nc = None
        self._js = None
        self._sub = None
        self._channel: grpc.aio.Channel | None = None
        self.platform: pb_grpc.PlatformStub | None = None

    def wants(self, event: Event) -> bool:
        raise NotImplementedError

    async def act(self, key: str, event: Event) -> AnyCommand:
        raise NotImplementedError

    async def start(self) -> str:
        self._channel = grpc.aio.insecure_channel(self.platform_addr)
        self.platform = pb_grpc.PlatformStub(self._channel)
        self._nc = await connect(self.nats_url, self.name)
        self._js = self._nc.jetstream()
        await ensure_streams(self._js)
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S, max_ack_pending=self._max_pending)
        self._sub = await self._js.subscribe(
            f"{EVT}.>", durable=self.durable, stream=EVENTS, cb=self._on_batch, manual_ack=True, config=config
        )
        return f"{self.name} (platform {self.platform_addr})"

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        await close(self._nc)
        if self._channel is not None:
            await self._channel.close()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _on_batch(self, msg: Msg) -> None:
        try:
            batch = decode_batch(msg.data)
        except Exception as e:
            log.error("%s: skipping unreadable batch %s: %s", self.name, msg.metadata.sequence.stream, e)
            await msg.term()
            return
        chosen = [e for e in batch.events if self.wants(e)]
        if chosen:
            self.spawn(self._perform(batch.key, chosen, msg))
        else:
            await msg.ack()

    async def _perform(self, key: str, events: list[Event], msg: Msg) -> None:
        alive = asyncio.create_task(_working_on(msg))
        try:
            await asyncio.gather(*(self._one(key, e) for e in events))
        except PlatformError as e:  # expected while the platform is away: one line, no traceback
            log.error("%s: batch %s failed; it will be redelivered: %s", self.name, msg.metadata.sequence.stream, e)
            await msg.nak(delay=5)
            return
        except Exception:
            log.exception("%s: batch %s failed; it will be redelivered", self.name, msg.metadata.sequence.stream)
            await msg.nak(delay=5)
            return
        finally:
            alive.cancel()
        await msg.ack()

    async def _one(self, key: str, event: Event) -> None:
        async with self._limit:
            report = await self.act(key, event)
        await publish_command(self._js, report)
