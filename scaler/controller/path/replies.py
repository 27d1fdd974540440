"""Replies: the one place a decision's answers go out, to callers in this process or elsewhere.

A caller in this process waits on a future under a subject of the node's own inbox: a real subject,
so that after a hand-over the partition's new owner can answer it over NATS, and the answer still
reaches it. A caller of another process (a front gateway, another node, a worker) waits on NATS.
"""

import itertools
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg

from scaler.proto.commands import Reply, decode_reply, encode

log = logging.getLogger("scaler.controller")


class Replies:
    def __init__(self) -> None:
        self._nc: Client | None = None
        self.inbox = ""
        self._waiting: dict[str, object] = {}  # reply subject -> the future of a caller in this process
        self._tokens = itertools.count()

    async def start(self, nc: Client) -> None:
        self._nc = nc
        self.inbox = nc.new_inbox()
        await nc.subscribe(f"{self.inbox}.*", cb=self._from_elsewhere)

    def expect(self, future) -> str:
        """A reply subject for a caller in this process, whose answer sets `future`."""
        to = f"{self.inbox}.{next(self._tokens)}"
        self._waiting[to] = future
        return to

    def forget(self, to: str) -> None:
        self._waiting.pop(to, None)

    def waits(self, to: str) -> bool:
        """Whether a caller in this process still waits on `to`."""
        return to in self._waiting

    async def send(self, replies: list[Reply]) -> None:
        for reply in replies:
            waiter = self._waiting.get(reply.to)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(reply)
            elif reply.to and not reply.to.startswith(self.inbox):  # a caller of another process, on NATS
                await self._nc.publish(reply.to, encode(reply))
            # else a caller of this process that stopped waiting

    async def _from_elsewhere(self, msg: Msg) -> None:
        """An answer decided by another node for a caller of ours (its partition changed hands meanwhile)."""
        waiter = self._waiting.get(msg.subject)
        if waiter is not None and not waiter.done() and msg.data:
            waiter.set_result(decode_reply(msg.data))
