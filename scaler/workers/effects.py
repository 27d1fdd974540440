"""What the two effect executors share: react to chosen events, call the platform, report back.

Each kind of worker has one durable consumer on the EVENTS stream that sees only the batches with
work for it (their subject names their effects, proto.subjects), shared by every process of that
kind (on any machine) as a queue group: NATS pushes each batch to one of them, and a batch a dead
or paused one held unacked goes to another after the ack wait. A queue group rather than a pull
consumer: delivery stays the push it was with one worker (a cold start's CreateSlot waits for no
fetch round), and the processes need no fetch loop of their own. An event is acted on at least
once: the batch is acked only after every outcome it caused was reported to the function's
controller, and answered (stored). The controller ignores repeated reports; a worker acting
on a batch again (`Delivery.redelivered`) must not repeat what the platform does not dedupe
(the platform worker: a new slot per CreateSlot), so it continues from what was recorded.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import ClassVar

import grpc
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError, ServerError

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.commands import AnyCommand, Reply, command_id
from scaler.proto.events import Event, decode_batch
from scaler.proto.subjects import EVENTS, EVT, report_subject, worker_subjects
from scaler.runtime import durability, tls
from scaler.runtime.access import Nats
from scaler.runtime.bus import Unavailable, close, connect, send
from scaler.runtime.faults import LastingFault
from scaler.runtime.tasks import cancelled
from scaler.store.config import Retention, ensure_stream

log = logging.getLogger("scaler.effects")

# Answers that mean "not now" rather than "no": the call is made again with backoff. CANCELLED is a
# call the platform's side dropped before it finished (its stream reset, its server stopping): it did
# nothing there (a CreateSlot whose call goes away is torn down, see platform_stub) or, on a platform
# idempotent per request id, the retry joins it.
BUSY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)
CALL_TIMEOUT_S = 120.0
PATIENCE_S = 30.0  # how long a throttled or unreachable platform is retried (a caller's Assign waits 60 s)
# An event a crashed worker was performing is redelivered after ACK_WAIT_S: kept short so a
# restarted worker resumes in seconds, while a long platform call in a live worker tells the
# server every third of it that it is still at work.
ACK_WAIT_S = 10.0
REPORT_PATIENCE_S = 60.0  # how long a report is retried before the batch is left for redelivery
RETRY_S = 5.0  # a failed batch comes back after this, doubled at each failure, up to RETRY_MAX_S
RETRY_MAX_S = 300.0
# A consumer made again right after it was dropped may be refused while nats-server still removes the old
# one's files (err 10012, "rename .../o.dat.tmp: no such file or directory", seen on a loaded machine).
RECREATE_TRIES = 5
WATCH_S = 2.0  # how often a worker looks that its durable consumer is still there
STOP_GRACE_S = 2.0  # at stop, work under way gets this long; the rest is redelivered to the next worker
# A platform that was away is tried again within 100 ms to 1 s (gRPC's default waits 1 s, growing
# to 2 min): while it is away the Assigns wait, and each second counts. Each worker has its own
# connection, so the gc worker finding the platform not yet up at start (the documented order:
# the scaler first, then the platform's simulator) leaves the platform worker's untouched.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.use_local_subchannel_pool", 1),
]


MAX_MESSAGE = 512  # characters of a platform's error message kept in a report (it goes into events)


class PlatformError(Exception):
    """A platform call failed for good; the message says which call and why. `away`: the platform did not
    answer at all (nothing listens there: a simulator's platform after its run), as opposed to refusing."""

    def __init__(self, message: str, away: bool = False, why: str = "") -> None:
        super().__init__(message)
        self.away = away
        self.why = why  # in a few words, when away: "Connection refused"


# The platform away is one fault however many workers of a process find it so (the platform and gc
# workers share one), said once with the platform's address, then only in LastingFault's summaries.
_AWAY: dict[str, LastingFault] = {}


def away(platform: str) -> LastingFault:
    return _AWAY.setdefault(platform, LastingFault(log, f"platform {platform}"))


class NotStored(Exception):
    """A report nobody stored within its patience: NATS away, or no controller serves the function's partition
    (every node down, or a take-over under way). The batch is left for redelivery."""


async def report(nc, cmd: AnyCommand, patience_s: float) -> Reply:
    """Send a report to its function's controller and return the answer; NotStored if nobody answers in time."""
    try:
        return await send(nc, cmd, patience_s=patience_s, subject=report_subject(cmd.key))
    except (Unavailable, NatsError, TimeoutError) as e:
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise NotStored(
            f"nobody stored its report {command_id(cmd)} on {report_subject(cmd.key)} within {patience_s:g}s"
            f" (no controller serves that partition, or NATS is away; last: {why})"
        ) from None


def brief(text: str) -> str:
    """A platform's message, cut to a size any event can carry."""
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


async def call_platform(method, request, what: str, patience_s: float = PATIENCE_S, platform: str = ""):
    """Call a Platform RPC; an answer of Throttle, RESOURCE_EXHAUSTED or UNAVAILABLE is retried with backoff.

    The challenge zeroes a run whose calls fail too often: a platform that is busy for a moment
    must cost the waiting request time, not its answer. What still fails after `patience_s`
    raises PlatformError with the platform's last word. An answer from `platform` ends its being away.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    delay = 0.05
    while True:
        try:
            reply = await method(request, timeout=CALL_TIMEOUT_S)
            away(platform).ended()
            if reply.status != pb.Throttle:
                return reply
            why = f"Throttle: {brief(reply.error_message)}" if reply.error_message else "Throttle"
        except grpc.aio.AioRpcError as e:
            if e.code() not in BUSY:
                raise PlatformError(f"{what}: {e.code().name}: {brief(e.details() or '')}") from None
            why = f"{e.code().name}: {brief(e.details() or '')}"
        if loop.time() + delay > deadline:
            gone = why.startswith(grpc.StatusCode.UNAVAILABLE.name)
            raise PlatformError(f"{what}: still {why} after {patience_s:g}s", gone, why.rsplit(": ", 1)[-1])
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def _working_on(msg: Msg, every_s: float) -> None:
    """Keep a message from being redelivered while this live worker is still performing it."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await msg.in_progress()
        except Exception as e:  # NATS away: the ack after the outage settles it, or ack_wait will
            log.debug("could not extend %s: %s", msg.reply, e)


@dataclass(frozen=True)
class Delivery:
    """Which batch an event came in, and whether it came before: a worker died or failed with it."""

    seq: int  # the batch's stream sequence
    redelivered: bool


class EffectWorker:
    """Base of the platform and gc workers: `wants` picks events, `act` performs one and returns its report."""

    durable: ClassVar[str]
    name: ClassVar[str]
    effect: ClassVar[str]  # the letter in a batch's `<effects>` token that means work for this worker

    def __init__(self, nats_url: Nats, platform: str, concurrency: int = 1024, ack_wait_s: float = ACK_WAIT_S) -> None:
        self.nats_url = nats_url
        self.retention: Retention | None = None  # EVENTS's limits, should this worker be the one to create it
        self.platform_addr = platform
        self.platform_tls: tls.ClientTls | None = None  # TLS to the platform (--platform-ca ...): in clear if None
        self.ack_wait_s = ack_wait_s  # how soon an event a dead worker was performing comes back
        self.patience_s = PATIENCE_S  # how long a busy platform is retried
        self._limit = asyncio.Semaphore(concurrency)
        self._max_pending = concurrency * 4
        self._tasks: set[asyncio.Task] = set()
        self._fault = LastingFault(log, self.name)  # the platform failing batch after batch
        self._unstored = LastingFault(log, f"{self.name} reports")  # ... or nobody storing the reports
        self._nc = None
        self._js = None
        self._sub = None
        self._watch: asyncio.Task | None = None
        self._channels: tls.Channels | None = None  # to the platform: made again when its TLS files change
        self._channel: grpc.aio.Channel | None = None
        self.platform: pb_grpc.PlatformStub | None = None

    def wants(self, event: Event) -> bool:
        raise NotImplementedError

    async def act(self, key: str, event: Event, delivery: Delivery) -> AnyCommand | None:
        """Perform one event; return the report for its function's controller (None: nothing to report)."""
        raise NotImplementedError

    def forget(self, events: list[Event]) -> None:
        """The batch of these events is acked: what was kept to resume them can go."""

    async def start(self) -> str:
        await tls.check_trust(self.platform_addr, self.platform_tls, "the platform")
        self._channels = tls.Channels(self.platform_addr, self.platform_tls, CHANNEL_OPTIONS, "the platform", self._use)
        self._nc = await connect(self.nats_url, self.name)
        self._js = self._nc.jetstream()
        await ensure_stream(self._js, durability.default_replicas(self._nc), self.retention)
        await self._subscribe()
        self._watch = asyncio.create_task(self._watch_consumer())
        over = " over TLS" if self.platform_tls is not None and self.platform_tls.on else ""
        return f"{self.name} (platform {self.platform_addr}{over})"

    def _use(self, channel: grpc.aio.Channel) -> None:
        self._channel, self.platform = channel, pb_grpc.PlatformStub(channel)

    async def _subscribe(self) -> None:
        """Join the kind's durable consumer on EVENTS, made if it is not there."""
        subjects = worker_subjects(self.effect)
        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self._max_pending,
            filter_subjects=subjects,
            deliver_group=self.durable,
        )
        if (resume := await self._drop_if_changed(subjects)) is not None:
            config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, resume
        for attempt in range(RECREATE_TRIES):
            try:
                self._sub = await self._js.subscribe(
                    f"{EVT}.>", queue=self.durable, stream=EVENTS, cb=self._on_batch, manual_ack=True, config=config
                )
                return
            except ServerError as e:  # the consumer just dropped: nats-server may still be removing its files
                if attempt == RECREATE_TRIES - 1:
                    raise
                log.info("%s: consumer %s not made yet (%s); trying again", self.name, self.durable, e.description)
                await asyncio.sleep(0.2)

    async def _watch_consumer(self) -> None:
        """The durable consumer gone (EVENTS deleted, or the consumer itself): nothing would come any more, and the
        scaler's cold starts would wait for nobody. Made again, said once, as soon as it is seen."""
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self._js.consumer_info(EVENTS, self.durable)
                continue
            except NotFoundError as e:
                gone = e.description or "not found"
            except Exception:  # NATS away: nothing to tell yet
                continue
            try:  # EVENTS itself gone: a node makes it again (with its replicas and retention), then this worker
                await self._js.stream_info(EVENTS)
            except Exception:
                continue
            log.error("%s: consumer %s on %s is gone (%s): making it again", self.name, self.durable, EVENTS, gone)
            try:
                await self._sub.unsubscribe()
                await self._subscribe()
            except Exception as e:  # tried again at the next look
                log.warning("%s: could not make consumer %s again: %s", self.name, self.durable, e)

    async def _drop_if_changed(self, subjects: list[str]) -> int | None:
        """A durable consumer keeps its filter and its delivery: one made for other subjects, or for a single
        process (before queue groups), is made again, resuming after the last batch all its work was done for.
        Returns that sequence, or None when the consumer is kept (or there was none)."""
        try:
            info = await self._js.consumer_info(EVENTS, self.durable)
        except NotFoundError:
            return None
        filtered = sorted(info.config.filter_subjects or [info.config.filter_subject or ""])
        if filtered == sorted(subjects) and info.config.deliver_group == self.durable:
            return None
        await self._js.delete_consumer(EVENTS, self.durable)
        log.info("%s: consumer %s made again for this version, from batch %d", self.name, self.durable,
                 info.ack_floor.stream_seq + 1)  # fmt: skip
        return info.ack_floor.stream_seq + 1

    async def stop(self) -> None:
        """Take no more work, and let what is under way finish for a moment: an event whose effect is not
        reported is not acked, so the next worker performs it again (effects are idempotent)."""
        await cancelled(self._watch)
        if self._sub is not None:
            with contextlib.suppress(NatsError):  # its consumer gone with the stream, say
                await self._sub.unsubscribe()
        if self._tasks:
            log.info(
                "%s: %d effects under way; they get %gs, then the next worker",
                self.name,
                len(self._tasks),
                STOP_GRACE_S,
            )
            _, late = await asyncio.wait(self._tasks, timeout=STOP_GRACE_S)
            await cancelled(*late)
        await close(self._nc)
        if self._channels is not None:
            await self._channels.close()

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
        chosen = [e for e in batch.events if self.wants(e)]  # the subject said there is at least one
        if chosen:
            self.spawn(self._perform(batch.key, chosen, msg))
        else:
            await msg.ack()

    async def _perform(self, key: str, events: list[Event], msg: Msg) -> None:
        alive = asyncio.create_task(_working_on(msg, self.ack_wait_s / 3))
        meta = msg.metadata
        retry_s = min(RETRY_S * 2 ** (meta.num_delivered - 1), RETRY_MAX_S)
        delivery = Delivery(meta.sequence.stream, meta.num_delivered > 1)
        try:
            await asyncio.gather(*(self._one(key, e, delivery) for e in events))
        except PlatformError as e:  # expected while the platform is away: one line, no traceback, then rarely
            if e.away:
                away(self.platform_addr).occurred(
                    f"the platform at {self.platform_addr} does not answer ({e.why}): what the scaler asks of it"
                    " (CreateSlot, Init, DestroySlot) waits and is tried again until it is back. A simulator's"
                    " platform goes when its run ends: then stop this scaler, or start the next run against it"
                )
            else:
                self._fault.occurred(f"{self.name}: batch {meta.sequence.stream} failed; it will be redelivered: {e}")
            await msg.nak(delay=retry_s)
            return
        except NotStored as e:  # expected while no controller serves the partition: as above
            self._unstored.occurred(f"{self.name}: batch {meta.sequence.stream} failed; it will be redelivered: {e}")
            await msg.nak(delay=retry_s)
            return
        except Exception:
            log.exception("%s: batch %s failed; it will be redelivered", self.name, meta.sequence.stream)
            await msg.nak(delay=retry_s)
            return
        finally:
            alive.cancel()
        self._fault.ended()
        self._unstored.ended()
        await msg.ack()
        self.forget(events)

    async def _one(self, key: str, event: Event, delivery: Delivery) -> None:
        async with self._limit:
            answer = await self.act(key, event, delivery)
        if answer is not None:
            await report(self._nc, answer, patience_s=REPORT_PATIENCE_S)
