"""The NATS side every component shares: connecting, and the two streams."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from proto.commands import AnyCommand, command_id, encode
from proto.subjects import CMD, COMMANDS, EVENTS, EVT, command_subject

log = logging.getLogger("scaler.bus")

DEDUPE_WINDOW_S = 120.0  # a command retried within this window (same Nats-Msg-Id) is dropped by JetStream

STREAMS = (
    # Commands are work: each is removed once the controller acks it.
    StreamConfig(
        name=COMMANDS,
        subjects=[f"{CMD}.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=DEDUPE_WINDOW_S,
    ),
    # Events are the log: kept whole, since all state is rebuilt from them.
    StreamConfig(
        name=EVENTS,
        subjects=[f"{EVT}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        duplicate_window=DEDUPE_WINDOW_S,
    ),
)


async def connect(url: str, name: str, reconnected: Callable[[], Awaitable[None]] | None = None) -> Client:
    """A connection that keeps reconnecting: a NATS restart is an outage, not a crash."""

    async def on_error(e: Exception) -> None:
        log.warning("%s: nats: %s", name, e)

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        error_cb=on_error,
        connect_timeout=5,
        reconnected_cb=reconnected,
    )


async def ensure_streams(js: JetStreamContext) -> None:
    """Create the streams, or bring existing ones to this configuration. Safe to run from every component."""
    for config in STREAMS:
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)


async def publish_command(js: JetStreamContext, cmd: AnyCommand, patience_s: float = 60.0) -> None:
    """Publish a report to the controller, retrying through a NATS outage for up to `patience_s`.

    The command's id is its Nats-Msg-Id, so a report published twice reaches the controller once.
    """
    delay = 0.05
    deadline = asyncio.get_running_loop().time() + patience_s
    while True:
        try:
            await js.publish(command_subject(cmd.key), encode(cmd), headers={"Nats-Msg-Id": command_id(cmd)})
            return
        except NatsError as e:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("publishing %s failed (%s); retrying", command_id(cmd), e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def close(nc: Client | None) -> None:
    """Drain the connection (flushing what is pending) if NATS is there; just close it if not."""
    if nc is None or nc.is_closed:
        return
    try:
        await asyncio.wait_for(nc.drain(), 5)
    except Exception:
        await nc.close()


@contextlib.asynccontextmanager
async def connected(url: str, name: str) -> AsyncIterator[Client]:
    """A connection for one piece of work, drained and closed when it is done."""
    nc = await connect(url, name)
    try:
        yield nc
    finally:
        await close(nc)
