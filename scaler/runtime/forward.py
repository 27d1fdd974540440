"""A front gateway's router: sends each call to the node that owns its function, over core NATS.

One inbox per gateway, one reply subject per call: a call is sent again on that same subject when
nobody owns the partition right now (NATS answers "no responders" at once: a node restarting or
a partition changing hands), when its owner could not store it, or when no answer came for a
while (a lost reply, or an owner that died with the call). A repeat is a no-op in the core, and
since it carries the same reply subject it adds no waiter, so the call is decided once. A call made
while the connection reconnects (a restarted nats-server, on a connection that buffers nothing) waits for it
as long as it would for a stalled NATS to answer, then is told UNAVAILABLE.
"""

import asyncio
import itertools
import logging

from msgspec.structs import replace
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from scaler.proto.commands import Assign, Cancel, Code, Idle, Reply, decode_reply, encode
from scaler.proto.subjects import CMD, command_subject
from scaler.runtime.access import Nats
from scaler.runtime.bus import Unavailable, close, connect, gave_up_why, send
from scaler.runtime.permissions import PROBE

log = logging.getLogger("scaler.forward")

RESEND_S = 2.0  # no answer this long: send the call again (its owner may have died with it)
PING_S = 1.0  # ... and NATS is asked whether it answers at all: given this long to
LATE_S = 0.5  # a ping's timeout firing this late says this process stood still, not that NATS did
PING = f"{CMD}.{PROBE}"  # where: a subject a node and a front gateway may publish on, and nobody serves
RECONNECT_POLL_S = 0.05  # a call made while the connection reconnects looks again this often
CANCEL_PATIENCE_S = 120.0
NO_RESPONDERS = "503"


class Forwarder:
    def __init__(self, nats_url: Nats, resend_s: float = RESEND_S) -> None:
        self.nats_url = nats_url
        self.resend_s = resend_s
        self._own_connection = True
        self.sent = 0  # sends, repeats included: how often calls had to be sent again shows here
        self._inbox = ""
        self._waiting: dict[str, asyncio.Queue[Reply | None]] = {}
        self._tokens = itertools.count()
        self._cancels: set[asyncio.Task] = set()
        self._nc = None

    @classmethod
    def over(cls, nc) -> "Forwarder":
        """A forwarder on a connection someone else opened (and closes): a node's, for partitions it does not serve."""
        forwarder = cls("")
        forwarder._nc, forwarder._own_connection = nc, False
        return forwarder

    async def start(self) -> str:
        if self._own_connection:
            self._nc = await connect(self.nats_url, "gateway")
        self._inbox = self._nc.new_inbox()
        await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
        return f"forwarding calls over {self.nats_url}"

    async def stop(self) -> None:
        if self._cancels:
            await asyncio.wait(self._cancels, timeout=5)
        if self._own_connection:
            await close(self._nc)

    async def call(self, cmd: Assign | Idle, timeout_s: float | None) -> Reply:
        to = f"{self._inbox}.{next(self._tokens)}"
        answers: asyncio.Queue[Reply | None] = asyncio.Queue()
        self._waiting[to] = answers
        cmd = replace(cmd, reply_to=to)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._until_answered(cmd, answers)
        except (TimeoutError, asyncio.CancelledError, Unavailable) as e:
            if isinstance(cmd, Assign):  # it may have been stored all the same
                self._cancel(cmd, gave_up_why(e, "NATS does not answer"))
            raise
        finally:
            del self._waiting[cmd.reply_to]

    async def _until_answered(self, cmd: Assign | Idle, answers: asyncio.Queue[Reply | None]) -> Reply:
        subject, body = command_subject(cmd.key), encode(cmd)
        delay = 0.02
        away_since = None  # when the connection was first found reconnecting, for this call
        while True:
            try:
                await self._nc.publish(subject, body, reply=cmd.reply_to)
            except NatsError as e:
                # Reconnecting (a restarted nats-server): given as long to come back as a stalled one to answer.
                now = asyncio.get_running_loop().time()
                away_since = now if away_since is None else away_since
                if self._nc.is_closed or now - away_since >= self.resend_s + PING_S:
                    raise Unavailable(f"NATS unavailable: {e!r}") from None
                await asyncio.sleep(RECONNECT_POLL_S)
                continue
            self.sent += 1
            try:
                reply = await asyncio.wait_for(answers.get(), self.resend_s)
            except TimeoutError:
                await self._answering()  # NATS itself may be stalled: then the caller is told so now
                continue  # lost, or its owner died with it: send it again
            if reply is not None and reply.code is not Code.UNAVAILABLE:
                return reply
            await asyncio.sleep(delay)  # nobody owns the partition right now, or its owner could not store
            delay = min(delay * 2, 1.0)

    async def _answering(self) -> None:
        """Unavailable when NATS does not answer in PING_S (stopped or cut off, its TCP connection still up): asked
        with a request on a subject nobody serves, which a live NATS answers at once with "no responders". (Not
        nats-py's flush: one given up leaves its PONG to break the connection when it comes.)

        A process running late (a loaded machine, a burst of calls) reads that answer late, and its own stall is not
        NATS's: while messages from NATS still come in it is there, and a wait this process stood still through
        (its timeout fired LATE_S past due) proves nothing, so NATS is asked again."""
        loop = asyncio.get_running_loop()
        while True:
            heard, began = self._nc.stats["in_msgs"], loop.time()
            try:
                await self._nc.request(PING, b"", timeout=PING_S)
            except NoRespondersError:
                return
            except TimeoutError:
                if self._nc.stats["in_msgs"] > heard:
                    return
                if loop.time() - began > PING_S + LATE_S:
                    continue
                raise Unavailable(
                    f"NATS does not answer (nothing in {PING_S:g}s): the call was not passed on"
                ) from None
            except NatsError as e:
                raise Unavailable(f"NATS unavailable: {e!r}") from None

    def _cancel(self, cmd: Assign, why: str) -> None:
        """Tell the owner this caller gave up, in the background: the Assign may have been stored."""
        cancel = Cancel(key=cmd.key, request_id=cmd.request_id, reply_to=cmd.reply_to, reason=why)
        task = asyncio.create_task(self._send_cancel(cancel))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _send_cancel(self, cancel: Cancel) -> None:
        try:
            await send(self._nc, cancel, patience_s=CANCEL_PATIENCE_S)
        except (NatsError, TimeoutError) as e:
            log.warning("could not cancel %s: %s", cancel.request_id, e)

    async def _on_reply(self, msg: Msg) -> None:
        answers = self._waiting.get(msg.subject)
        if answers is None:
            return  # a repeat's answer after the call was answered, or a call given up
        if not msg.data and (msg.headers or {}).get("Status") == NO_RESPONDERS:
            answers.put_nowait(None)
        else:
            answers.put_nowait(decode_reply(msg.data))
