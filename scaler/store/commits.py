"""Shared commits: when many functions' appends are on their way at once, the next ones go as one atomic batch.

With every write synced, each message JetStream stores costs a disk sync and an ack, and appends sent at once
are synced one after another: each one on its way adds about 0.4 ms to the next. On a stream that takes atomic
batches (nats-server 2.12+, `allow_atomic`), an append that finds `share_from` messages on their way waits
instead, with those that come after it, for the next batch: one commit and one ack for them all. How many is
the stream's. A lone server (R1) stages an atomic batch on disk before it commits it, the stream locked
meanwhile: a batch of two to five took 6-7 ms where the same appends sent at once took 1.7-3.3 (bench/sync.py),
so a lone append is quicker until a dozen are on their way. But each lone append costs the node and the server
the CPU of a message and an ack of its own, and a burst of calls is short of CPU first: on a lone server appends
share a commit once `SHARE_FROM_LONE` (4) are on their way, which a few functions called at a steady pace seldom
reach. A cluster stages a batch in memory and replicates it once, never slower than the appends alone: there an
append shares one as soon as anything is on its way. Until then each is sent at once, alone.

Each message keeps its own function's order check, and the batch is all or nothing. JetStream checks
every message of a batch against the stream as it was before the batch, and its guard against two
messages of one subject in a batch looks up the concrete subjects, not the wildcard our check names:
two appends of one function in one batch would both pass, a doubled write. So a batch holds at most
one append per function; a second waits for the next batch, where its check sees the first. Appends
leave in the order they came (one waiting, those after it wait too), on one connection: a function's
second append reaches JetStream after its first.

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
SHARE_FROM_LONE = 4  # on a lone server, messages on their way before the next append waits to share a commit


class _Waiting(NamedTuple):
    append: Append
    done: asyncio.Future[int]


class Commits:
    def __init__(self, nc: Client, timeout_s: float, atomic: bool, writer: str = "") -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.writer = writer  # the node appending, named in each message's headers
        self.atomic = atomic  # the stream takes atomic batches
        self.share_from = 1  # messages on their way (alone, or a batch) before an append waits to share one
        self._on_way = 0  # messages on their way to JetStream: lone appends, and the batch being committed
        self._waiting: list[_Waiting] = []  # appends waiting for the next batch, in arrival order
        self._sender: asyncio.Task | None = None  # commits the waiting appends, a batch at a time

    async def store(self, a: Append) -> int:
        """Store one function's batch after its expected last sequence; its stream sequence.

        Conflict, TooBig and Unavailable as `stream.append`. An append whose caller stops waiting is
        stored all the same (as a publish already sent would be): its function's next append conflicts.
        """
        if not self.atomic:
            return await self._alone(a)
        if self._waiting or self._on_way >= self.share_from:
            stream.fits(len(a.data), self.nc.max_payload)
            waiting = _Waiting(a, asyncio.get_running_loop().create_future())
            waiting.done.add_done_callback(_seen)  # its caller may have left: nobody else reads the outcome
            self._waiting.append(waiting)
            return await asyncio.shield(waiting.done)
        self._on_way += 1
        try:
            return await self._alone(a)
        finally:
            self._on_way -= 1
            if self._waiting and self._sender is None:
                self._sender = asyncio.create_task(self._send())  # on until no append waits

    async def _send(self) -> None:
        group: list[_Waiting] = []
        try:
            while self._waiting:
                group = self._take()
                self._on_way += 1
                try:
                    outcomes = await self._commit([w.append for w in group])
                finally:
                    self._on_way -= 1
                for w, outcome in zip(group, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        w.done.set_exception(outcome)
                    else:
                        w.done.set_result(outcome)
                group = []
        finally:
            self._sender = None
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
