"""The EVENTS stream: appending a batch, and reading in order (how the controller rebuilds at start and
how `scaler replay` reads).

An ordered push consumer is the fast way to read a stream front to back. It is told where to
start; it stops at the stream's last sequence as it was when reading began (or `until_seq`), so
a live stream that keeps growing cannot make a reader wait forever, and an empty range returns
at once. A batch this version cannot decode stops the read with a clear error instead of
silently leaving it out of the state.
"""

import asyncio
import secrets
from collections.abc import Callable
from time import perf_counter
from typing import NamedTuple

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError

from scaler.proto.events import Batch, decode_batch
from scaler.proto.subjects import EVENTS, EVT
from scaler.runtime import metrics
from scaler.runtime.bus import Unavailable

ALL = f"{EVT}.>"

# Called for each batch in stream order with its stream sequence; returning True stops the read.
OnBatch = Callable[[int, Batch], bool | None]
OnStamp = Callable[[Batch, int, str], None]  # a batch read, when the server stored it (epoch ms), and who wrote it
WRITER = "Scaler-Writer"  # the header naming the node that appended a batch (whose clock its times are on)


class UnreadableStream(Exception):
    """A stored batch could not be decoded: the state cannot be rebuilt past it."""


class Conflict(Exception):
    """Someone else appended to the function's subjects since we last read them."""


class TooBig(Exception):
    """The batch is larger than NATS takes in one message: it can never be stored."""


STALL_S = 10.0  # a read that hears nothing this long is given up (its caller retries)
HEADERS_ROOM = 512  # bytes of a message's headers, which count against the payload limit too


class _ApiError(msgspec.Struct):
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    seq: int = 0
    error: _ApiError | None = None


_ack = msgspec.json.Decoder(_Ack)
WRONG_LAST_SEQUENCE = 10071


async def append(
    nc: Client, subject: str, data: bytes, key_subjects: str, last_seq: int, timeout_s: float, writer: str = ""
) -> int:
    """Store one batch if the last one on `key_subjects` is still `last_seq`; returns its stream sequence.

    Raises Conflict when another batch came first (another writer, or our own whose ack was lost),
    TooBig when no NATS message can hold it, and Unavailable when JetStream did not take it. The
    publish is done by hand: nats-py's js.publish parses its ack with json and a dataclass, a tenth
    of the append's CPU.
    """
    fits(len(data), nc.max_payload)
    headers = {
        "Nats-Expected-Last-Subject-Sequence": str(last_seq),
        "Nats-Expected-Last-Subject-Sequence-Subject": key_subjects,
    }
    if writer:
        headers[WRITER] = writer
    began = perf_counter()
    try:
        msg = await nc.request(subject, data, timeout=timeout_s, headers=headers)
    except (NatsError, TimeoutError) as e:
        raise Unavailable(f"event store unavailable: {type(e).__name__}") from e
    finally:
        metrics.APPEND.observe(perf_counter() - began)
    ack = _ack.decode(msg.data)
    _refused(ack.error, subject)
    return ack.seq


class Rejected(Unavailable):
    """JetStream answered, refusing the write for another reason than an order check (a full disk, say); not
    bus.Refused, which is NATS refusing the client."""


def _refused(error: _ApiError | None, what: str) -> None:
    """Conflict for a failed order check, Rejected for any other refusal; nothing when stored."""
    if error is None:
        return
    if error.err_code == WRONG_LAST_SEQUENCE:
        raise Conflict(what)
    raise Rejected(f"event store refused the batch: {error.description}")


def fits(size: int, max_payload: int) -> None:
    """TooBig when a batch of `size` bytes is more than one NATS message holds (headers included)."""
    if size + HEADERS_ROOM > max_payload:
        raise TooBig(f"a batch of {size} bytes, over the event store's {max_payload}-byte message limit")


class _BatchAck(msgspec.Struct):
    seq: int = 0
    count: int = 0
    error: _ApiError | None = None


_batch_ack = msgspec.json.Decoder(_BatchAck)
OLDEST_ATOMIC = (2, 12)  # the first nats-server with atomic batch publish


def takes_atomic(nc: Client) -> bool:
    """Whether the server this client is connected to takes atomic batches (`allow_atomic` on a stream)."""
    v = nc.connected_server_version
    return (v.major, v.minor) >= OLDEST_ATOMIC


class Append(NamedTuple):
    """One batch to append: its subject and bytes, the order check over the function's subjects, and whether it may
    still be sent (asked just before each time it is: a writer that lost the right to write sends nothing more)."""

    subject: str
    data: bytes
    key_subjects: str
    last_seq: int
    sendable: Callable[[], bool] = lambda: True


NOT_SENDABLE = "its writer may no longer write it"  # past its lease's renewal deadline (`Append.sendable`)


class NotSent(Unavailable):
    """The append was not sent: its writer may no longer write it (`Append.sendable`)."""


async def append_all(nc: Client, appends: list[Append], timeout_s: float, writer: str = "") -> list[int]:
    """Store several functions' batches as one atomic batch (one ack); their stream sequences, in order.

    All are stored or none: Conflict when one function's order check fails (which one, JetStream does
    not say), Unavailable when JetStream did not take them. Needs a stream with `allow_atomic` (2.12+).
    """
    began = perf_counter()
    try:
        return await atomic(nc, appends, timeout_s, writer)
    finally:
        metrics.APPEND.observe(perf_counter() - began)


async def atomic(nc: Client, messages: list[Append], timeout_s: float, writer: str = "") -> list[int]:
    """Store messages on any stream that allows atomic batches, each after its own expected last sequence, all or
    none: their stream sequences, in order. Conflict and Unavailable as `append_all`."""
    batch_id = secrets.token_hex(8)
    try:
        for n, a in enumerate(messages, 1):
            headers = {
                "Nats-Batch-Id": batch_id,
                "Nats-Batch-Sequence": str(n),
                "Nats-Expected-Last-Subject-Sequence": str(a.last_seq),
                "Nats-Expected-Last-Subject-Sequence-Subject": a.key_subjects,
            }
            if writer:
                headers[WRITER] = writer
            if n < len(messages):
                await nc.publish(a.subject, a.data, headers=headers)
            else:
                headers["Nats-Batch-Commit"] = "1"
                msg = await nc.request(a.subject, a.data, timeout=timeout_s, headers=headers)
    except (NatsError, TimeoutError) as e:
        raise Unavailable(f"event store unavailable: {type(e).__name__}") from e
    ack = _batch_ack.decode(msg.data)
    _refused(ack.error, ack.error.description if ack.error is not None else "")
    if ack.count != len(messages):
        raise Unavailable(f"event store stored {ack.count} of a batch of {len(messages)}")
    return list(range(ack.seq - ack.count + 1, ack.seq + 1))


async def last_seq(js: JetStreamContext, subject: str = ALL) -> int:
    """The stream sequence of the newest batch on `subject` (0 when there is none)."""
    if subject == ALL:
        return (await js.stream_info(EVENTS)).state.last_seq
    try:
        return (await js.get_last_msg(EVENTS, subject)).seq
    except NotFoundError:
        return 0


OLDEST_SERVER = (2, 11)  # the first nats-server with Nats-Expected-Last-Subject-Sequence-Subject


def check_server(nc: Client) -> None:
    """Refuse a nats-server older than 2.11: it ignores the header that makes the order check span a
    function's subjects, so it would refuse every append after a function's first, forever."""
    v = nc.connected_server_version
    if (v.major, v.minor) < OLDEST_SERVER:
        raise RuntimeError(
            f"nats-server {v.major}.{v.minor}.{v.patch} is too old: the event stream's order check needs 2.11 or later"
            " (every server of a cluster)"
        )


async def check_layout(js: JetStreamContext) -> None:
    """Refuse a store written with one subject per function (`evt.<token>`, before partitions):
    its batches are readable, but the order check of an append would not see them."""
    info = await js.stream_info(EVENTS, subjects_filter=f"{EVT}.*")
    if info.state.subjects:
        raise RuntimeError(
            f"the {EVENTS} stream holds batches in the old subject layout (evt.<metaKey>, {len(info.state.subjects)}"
            " functions): it was written by an older scaler; start with a fresh store (another --data-dir)"
        )


async def stream_id(js: JetStreamContext) -> str:
    """Which incarnation of the EVENTS stream this is (its creation time): a deleted and recreated
    store has the same name but another history, and a snapshot of the old one must not be used."""
    return incarnation(await js.stream_info(EVENTS))


def incarnation(info: StreamInfo) -> str:
    return info.created.isoformat() if info.created else ""


class Kept(NamedTuple):
    """What EVENTS holds now: the first and last sequences kept, which incarnation of the stream it is, the
    configuration it keeps them by, and the bytes they take."""

    first_seq: int
    last_seq: int
    stream_id: str
    config: StreamConfig | None = None
    bytes: int = 0

    @property
    def truncated(self) -> bool:
        """Retention dropped batches (an empty stream whose batches all aged out included)."""
        return self.first_seq > 1


async def kept(js: JetStreamContext) -> Kept:
    info = await js.stream_info(EVENTS)
    return Kept(info.state.first_seq, info.state.last_seq, incarnation(info), info.config, info.state.bytes)


async def read(
    js: JetStreamContext,
    on_batch: OnBatch,
    subject: str = ALL,
    after_seq: int = 0,
    until_seq: int | None = None,
    on_stamp: OnStamp | None = None,
) -> int:
    """Call `on_batch` for every batch on `subject` with after_seq < seq <= end, in order; return how many.

    `end` is `until_seq`, or else the subject's last sequence when the read starts. `on_stamp`, when given,
    is told each batch's server stamp (epoch ms, the server's clock) and writer before `on_batch` is called.
    """
    end = await last_seq(js, subject)
    if until_seq is not None:
        end = min(end, until_seq)
    if end <= after_seq:
        return 0
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    count, heard_at = 0, loop.time()

    async def deliver(msg: Msg) -> None:
        nonlocal count, heard_at
        heard_at = loop.time()
        if done.done():
            return
        meta = msg.metadata
        seq = meta.sequence.stream
        if seq > end:  # a live stream grew past where this read ends
            done.set_result(None)
            return
        try:
            batch = decode_batch(msg.data)
        except Exception as e:
            done.set_exception(UnreadableStream(f"EVENTS seq {seq} on {msg.subject}: {e}"))
            return
        count += 1
        try:
            if on_stamp is not None:
                on_stamp(batch, round(meta.timestamp.timestamp() * 1000), (msg.headers or {}).get(WRITER, ""))
            stop = on_batch(seq, batch)
        except Exception as e:
            done.set_exception(e)
            return
        if stop or seq >= end or meta.num_pending == 0:
            done.set_result(None)

    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1)
    sub = await js.subscribe(subject, stream=EVENTS, ordered_consumer=True, cb=deliver, config=config)
    try:
        # Batches in the range may all have been deleted: then nothing is delivered at all.
        probe = await sub.consumer_info()
        if probe.num_pending == 0 and probe.delivered.consumer_seq == 0:
            return 0
        while not done.done():  # a consumer lost with its server (a cluster's failover) delivers nothing more
            await asyncio.wait({done}, timeout=STALL_S)
            if not done.done() and loop.time() - heard_at >= STALL_S:
                raise Unavailable(f"reading EVENTS stalled: nothing delivered for {STALL_S:g}s after {count} batches")
        done.result()
    finally:
        await sub.unsubscribe()
    return count
