"""Shared commits: the appends of different functions that meet while one is on its way go as one atomic batch.

With every write synced, each message JetStream stores costs a disk sync and an ack. On a stream that
takes atomic batches (nats-server 2.12+, `allow_atomic`), the appends arriving while a message or a
batch is on its way are sent next as one batch: one commit and one ack for them all. A lone append,
when nothing is on its way, is sent at once, alone.

Each message keeps its own function's order check, and the batch is all or nothing. JetStream checks
every message of a batch against the stream as it was before the batch, and its guard against two
messages of one subject in a batch looks up the concrete subjects, not the wildcard our check names:
two appends of one function in one batch would both pass, a doubled write. So a batch holds at most
one append per function; a second waits for the next batch, where its check sees the first.

When one function's check fails, JetStream refuses the batch without saying which: each append is
then sent alone, so the others are stored and only the stale one gets its Conflict. A batch without
an answer leaves each of its appends without one (Unavailable): the writer tries each again, and its
order check tells whether it was stored.
"""

import asyncio
from typing import NamedTuple

from nats.aio.client import Client

from scaler.runtime.bus import Unavailable
from scaler.store import stream
from scaler.store.stream import NOT_SENDABLE, Append, Conflict, NotSent

MAX_ATOMIC = 1000  # appends in one atomic batch, at most (JetStream's limit)


class _Waiting(NamedTuple):
    append: Append
    done: asyncio.Future[int]


class Commits:
    def __init__(self, nc: Client, timeout_s: float, atomic: bool, writer: str = "") -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.writer = writer  # the node appending, named in each message's headers
        self.atomic = atomic  # the stream takes atomic batches
        self._busy = False  # a message or a batch is on its way to JetStream
        self._waiting: list[_Waiting] = []  # appends that came meanwhile, in arrival order
        self._sender: asyncio.Task | None = None

    async def store(self, a: Append) -> int:
        """Store one function's batch after its expected last sequence; its stream sequence.

        Conflict, TooBig and Unavailable as `stream.append`. An append whose caller stops waiting is
        stored all the same (as a publish already sent would be): its function's next append conflicts.
        """
        if not self.atomic:
            return await self._alone(a)
        if self._busy:
            stream.fits(len(a.data), self.nc.max_payload)
            waiting = _Waiting(a, asyncio.get_running_loop().create_future())
            waiting.done.add_done_callback(_seen)  # its caller may have left: nobody else reads the outcome
            self._waiting.append(waiting)
            return await asyncio.shield(waiting.done)
        self._busy = True
        try:
            return await self._alone(a)
        finally:
            if self._waiting:
                self._sender = asyncio.create_task(self._send())  # busy until every waiting append is sent
            else:
                self._busy = False

    async def _send(self) -> None:
        group: list[_Waiting] = []
        try:
            while self._waiting:
                group = self._take()
                outcomes = await self._commit([w.append for w in group])
                for w, outcome in zip(group, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        w.done.set_exception(outcome)
                    else:
                        w.done.set_result(outcome)
                group = []
        finally:
            self._busy = False
            for w in group:  # cancelled (the node stops) while on its way: stored or not, nobody can tell
                if not w.done.done():
                    w.done.set_exception(Unavailable("event store unavailable: the node stops"))
            for w in self._waiting:
                w.done.set_exception(NotSent("the node stops"))
            self._waiting = []

    def _take(self) -> list[_Waiting]:
        """The next batch: the waiting appends in arrival order, one per function; the rest wait on. One its writer
        may no longer send is refused, unsent."""
        group: list[_Waiting] = []
        rest: list[_Waiting] = []
        functions: set[str] = set()
        for w in self._waiting:
            if not w.append.sendable():
                w.done.set_exception(NotSent(f"{w.append.subject}: {NOT_SENDABLE}"))
            elif len(group) < MAX_ATOMIC and w.append.key_subjects not in functions:
                functions.add(w.append.key_subjects)
                group.append(w)
            else:
                rest.append(w)
        self._waiting = rest
        return group

    async def _commit(self, appends: list[Append]) -> list[int | BaseException]:
        """Each append's outcome: its stream sequence, or what refused it."""
        if len(appends) > 1:
            try:
                return list(await stream.append_all(self.nc, appends, self.timeout_s, self.writer))
            except Conflict:  # one function's check failed, JetStream does not say which: each alone
                pass
            except Exception as e:
                return [e] * len(appends)
        return await asyncio.gather(*(self._alone(a) for a in appends), return_exceptions=True)

    async def _alone(self, a: Append) -> int:
        if not a.sendable():
            raise NotSent(f"{a.subject}: {NOT_SENDABLE}")
        return await stream.append(self.nc, a.subject, a.data, a.key_subjects, a.last_seq, self.timeout_s, self.writer)


def _seen(done: asyncio.Future[int]) -> None:
    if not done.cancelled():
        done.exception()
