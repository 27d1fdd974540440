"""The NATS side every component shares: connecting, the event stream, and sending a command to its owner."""

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client
from nats.errors import AuthorizationError, ConnectionClosedError, NoServersError, StaleConnectionError
from nats.errors import Error as NatsError
from nats.js.errors import ServiceUnavailableError

from scaler.proto.commands import AnyCommand, Code, Reply, command_id, decode_reply, encode
from scaler.proto.subjects import command_subject
from scaler.runtime.access import Nats, access, follow
from scaler.runtime.tasks import cancelled

T = TypeVar("T")

log = logging.getLogger("scaler.bus")

ATTEMPT_S = 10.0  # how long one attempt to reach a command's owner waits for its answer


class Unavailable(Exception):
    """The event store, or the owner of a command's function, could not be reached: nothing was answered."""


CONNECT_PATIENCE_S = 10.0  # how long a start waits for NATS before it gives up
DRAIN_S = 4  # how long closing waits for the subscriptions to drain (nats-py's drain_timeout)
LOST = (OSError, TimeoutError, StaleConnectionError, ConnectionClosedError, NoServersError)  # errors of an outage


def gave_up_why(e: BaseException, unavailable: str) -> str:
    """Why a call's wait for its answer ended, as the Cancel of its Assign says: `unavailable` for every kind of
    Unavailable (not sent, rejected), a timeout as such; anything else (a cancellation) is the caller gone."""
    if isinstance(e, TimeoutError):
        return "no answer in time"
    if isinstance(e, Unavailable):
        return unavailable
    return "caller disconnected"


class Refused(Unavailable):
    """NATS refused this client (its credentials, or TLS either way): a mistake to say, not an outage to wait out."""


def refusal(e: Exception) -> str | None:
    """How NATS and this client failed to agree, when a connection error says they did (None: an outage)."""
    if isinstance(e, AuthorizationError) or "authorization violation" in str(e).lower():
        return (
            "refuses this client: authorization violation (credentials missing or wrong: --nats-creds, --nats-nkey,"
            " --nats-user)"
        )
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"shows a certificate not trusted here: {e.verify_message} (--nats-ca)"
    if isinstance(e, ssl.SSLError):
        return f"and this client failed to agree on TLS: {e.reason or e} (--nats-ca, --nats-cert)"
    return None


async def connect(
    url: Nats,
    name: str,
    reconnected: Callable[[], Awaitable[None]] | None = None,
    patience_s: float = CONNECT_PATIENCE_S,
    buffered: bool = True,
) -> Client:
    """A connection that keeps reconnecting: a NATS restart is an outage, not a crash.

    The first connection is given `patience_s`, then Unavailable says where NATS was looked for:
    a NATS that was never there is a mistake to report, not an outage to wait out; one that refuses
    this client (Refused: credentials, TLS) is said at once. `url` may carry the whole access
    (scaler/runtime/access.py: TLS, credentials). An outage is one line when it starts and one when
    it ends, not one per reconnect attempt. Not `buffered`, a publish while it reconnects fails at once rather than
    wait in the client to be sent once it is back (a writer whose right to write may lapse meanwhile).
    """
    nats = access(url)
    options = nats.options()
    nc = Client()
    started = False
    down: list[Exception] = []  # connection errors of the outage under way (or of the first connection)

    async def on_error(e: Exception) -> None:
        if nc.is_closed:  # said by the close itself (a TLS close notify): the connection is done with
            return
        if not started and (why := refusal(e)):
            raise Refused(f"{name}: NATS at {nats} {why}")
        if not isinstance(e, LOST):  # not about the connection (a slow consumer, a permissions violation): each counts
            log.warning("%s: nats: %s", name, e)
            return
        if started and not down:
            log.warning("%s: nats: connection lost (%s); reconnecting", name, e or type(e).__name__)
        down.append(e)

    async def on_reconnected() -> None:
        log.warning("%s: nats: reconnected (after %d failed attempts)", name, len(down))
        down.clear()
        if reconnected is not None:
            await reconnected()

    try:
        async with asyncio.timeout(patience_s):
            await nc.connect(
                nats.servers,
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                error_cb=on_error,
                connect_timeout=5,
                drain_timeout=DRAIN_S,
                reconnected_cb=on_reconnected,
                **({} if buffered else {"pending_size": 0}),
                **options,
            )
    except Refused:
        with contextlib.suppress(TimeoutError):  # nats-py's close waits forever on a TLS handshake it gave up
            await asyncio.wait_for(nc.close(), 1)
        raise
    except TimeoutError:
        await nc.close()
        why = f": {down[-1] or type(down[-1]).__name__}" if down else ""
        raise Unavailable(f"cannot reach NATS at {nats} (tried for {patience_s:g}s{why})") from None
    started = True
    down.clear()
    follow(nc, nats)
    return nc


async def answered(ask: Callable[[], Awaitable[T]], patience_s: float = 30.0, pause_s: float = 0.2) -> T:
    """`ask()`'s answer, asked again while JetStream does not answer or says it cannot (up to `patience_s`, then
    TimeoutError): a cluster's JetStream, and a stream or bucket new on it, answers nothing until it has elected a
    leader ("temporarily unavailable", 503); a server remaking its accounts (SIGHUP under deploy/nats.conf) has for
    a moment no responder for JetStream's API (nats-server issue 1736 was the lasting form of it). Both are
    nats-py's ServiceUnavailableError."""
    async with asyncio.timeout(patience_s):
        while True:
            try:
                return await ask()
            except TimeoutError:
                log.info("JetStream does not answer yet; waiting")
            except ServiceUnavailableError:
                pass
            await asyncio.sleep(pause_s)


async def send(nc: Client, cmd: AnyCommand, patience_s: float = 60.0, subject: str = "") -> Reply:
    """Send a command to its partition's owner and return the answer, retrying for up to `patience_s`.

    Through a NATS outage, a controller's restart or a partition changing hands nobody answers
    for a while; the command is sent again until someone does. Sending it twice is harmless: the
    core turns a command it already applied into a no-op.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    subject = subject or command_subject(cmd.key)
    delay, said = 0.05, False
    while True:
        try:
            msg = await nc.request(subject, encode(cmd), timeout=max(0.1, min(ATTEMPT_S, deadline - loop.time())))
            reply = decode_reply(msg.data)
            if reply.code is not Code.UNAVAILABLE:
                return reply
            failure: Exception = Unavailable(reply.message)  # its owner could not store it, or no longer owns it
        except (NatsError, TimeoutError) as e:
            failure = e
        if loop.time() + delay > deadline:
            raise failure
        if not said:  # once per command: an outage is one line, not one per attempt
            log.warning("%s: no answer on %s (%s); retrying", command_id(cmd), subject, type(failure).__name__)
            said = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def close(nc: Client | None) -> None:
    """Drain the connection (flushing what is pending) if NATS is there; just close it if not.

    Whether it is there is asked first (a flush, answered within a second): a drain begun against a NATS
    that died a moment ago waits out its timeout. NATS may still die during the drain: nats-py's own
    drain timeout (DRAIN_S) then ends it, before ours does. Cut short from outside, a drain leaves
    nats-py's gathered subscription drains failed and unread (a traceback in the log of a process that
    stopped cleanly)."""
    if nc is None or nc.is_closed:
        return
    try:
        if not nc.is_connected:
            raise ConnectionError("NATS is away")
        await nc.flush(timeout=1)
        await asyncio.wait_for(nc.drain(), DRAIN_S + 1)
    except Exception:
        with contextlib.suppress(Exception):  # NATS gone: its transport may be closed already
            await nc.close()


async def while_connected(nc: Client | None, work: Awaitable[None], what: str) -> bool:
    """Do `work` while NATS is connected; give it up at once if the connection is or gets lost.

    For the last words of a stop (snapshots, giving leases back): against a NATS that is gone (an
    embedded one stopped with us) each request would wait out its timeout, keeping the process
    and its ports for tens of seconds, for nothing. Whether `work` was done.
    """
    task = asyncio.ensure_future(work)
    while nc is not None:
        done, _ = await asyncio.wait([task], timeout=0.05)
        if done:
            break
        if not nc.is_connected:
            await cancelled(task)
            log.warning("NATS is away; stopping without %s", what)
            return False
    await task
    return True


@contextlib.asynccontextmanager
async def connected(url: Nats, name: str) -> AsyncIterator[Client]:
    """A connection for one piece of work, drained and closed when it is done."""
    nc = await connect(url, name)
    try:
        yield nc
    finally:
        await close(nc)
