"""The write path: appending each function's batches to EVENTS, in order, once, and knowing what is stored.

The event-store verbs (rita's shape): `append` stores a batch if the function's last stored batch
is still the one the ledger holds (the expected last subject sequence over the function's subjects),
so a second writer or a repeat of our own fails as a `Conflict` instead of corrupting the stream;
`catch_up` folds what the stream holds of a function beyond the ledger (another writer's batches,
or our own whose ack was lost); `settle` resolves a doubtful batch, one whose append got no answer
and may be stored all the same. The writer decides nothing: it stores batches and folds stored ones.

The writer is the one part of the node that appends; the store itself is scaler/store (where the appends
of different functions that meet on their way share a commit).
"""

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from nats.errors import Error as NatsError

from scaler.controller.ledger import Ledger
from scaler.proto.events import Batch, encode_batch
from scaler.proto.subjects import event_subject, function_events, partition
from scaler.runtime.bus import Unavailable
from scaler.store import Append, Conflict, EventStore, NotSent, TooBig

__all__ = ["FENCE", "Conflict", "Doubt", "StoreLost", "TooBig", "Writer"]

APPEND_PATIENCE_S = 10.0  # how long an append is retried while JetStream does not answer (a cluster's failover)
STORE_TROUBLE_S = 5.0  # an append failed to reach JetStream this recently: the store is in trouble
SLOW_APPEND_S = 1.0  # an append under way this long: the store is slow, whatever waits behind it


class StoreLost(Unavailable):
    """EVENTS holds less than this node folded, and not by retention: batches were lost (an older copy of the
    store, a store emptied or replaced). The state is not to be trusted until reloaded from the stream."""


class Doubt(NamedTuple):
    """A batch whose append got no answer (or whose answer the ledger never took): stored, or not, or not yet."""

    batch: Batch
    after: int  # the function's last batch it was decided after: it can only ever be stored right after that one
    floor: int  # the ledger's sequence when it was sent: no snapshot of its partition claims past this until settled
    epoch: int  # its partition's epoch when it was decided (see Writer.forget): appended again only within it


FENCE = "fence"  # the cause of a fence: an empty batch that settles a doubt from a lease this node has since lost


class Writer:
    def __init__(
        self,
        store: EventStore,
        ledger: Ledger,
        decides: Callable[[str], bool],
        patience_s: float = APPEND_PATIENCE_S,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.decides = decides  # whether this node may still write a function (its partition served, its lease fresh)
        self.patience_s = patience_s
        self.doubtful: dict[str, Doubt] = {}  # by function: a batch that may be stored all the same (see settle)
        self._epochs: Counter[int] = Counter()  # by partition: how many times this node gave it up
        self._appending: dict[int, int] = {}  # appends in flight, by the ledger's `seq` when each began
        self._since: dict[int, float] = {}  # appends under way: when each began (monotonic)
        self._tokens = itertools.count()
        self._trouble_at = -1e9  # when an append last failed to reach JetStream (monotonic)

    def epoch(self, key: str) -> int:
        """The epoch of the function's partition: a decision is stored only within the epoch it was taken in."""
        return self._epochs[partition(key)]

    async def append(self, batch: Batch, after: int | None = None, epoch: int | None = None) -> int:
        """Store `batch` right after the function's batch `after` (by default the last one the ledger holds), within
        `epoch` (by default the current one); its stream sequence.

        Conflict: another batch came first (fold it with `catch_up`). TooBig: no NATS message can
        hold it. Unavailable: JetStream did not answer in time, or the partition is no longer this node's to
        write (its lease lapsed or went elsewhere, and nothing more is sent); the batch is then doubtful, if any
        of it was sent. So is one whose caller stopped waiting: what was sent may be stored all the same.
        The order check it is sent with never moves: a batch decided on one state is stored on that state or not
        at all, however late a try lands.
        """
        after = self.ledger.last_seq.get(batch.key, 0) if after is None else after
        epoch = self.epoch(batch.key) if epoch is None else epoch
        floor = self.ledger.seq  # a snapshot's watermark stays below this append until it is applied
        self._appending[floor] = self._appending.get(floor, 0) + 1
        token = next(self._tokens)
        self._since[token] = time.monotonic()
        sent = 0  # tries that went out (or may have: one whose caller left is sent all the same)
        try:
            subject, data = event_subject(batch.key, batch.effects), encode_batch(batch)
            append = Append(subject, data, function_events(batch.key), after, lambda: self._writes(batch.key, epoch))
            loop = asyncio.get_running_loop()
            deadline, delay = loop.time() + self.patience_s, 0.05
            while True:  # a repeat is safe: its order check makes it a conflict when the first was stored after all
                try:
                    sent += 1
                    return await self.store.append(append)
                except NotSent:
                    sent -= 1
                    raise
                except Unavailable:
                    self._trouble_at = time.monotonic()
                    if loop.time() + delay > deadline or not self._writes(batch.key, epoch):
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
        except (Unavailable, asyncio.CancelledError):
            if sent:  # no answer is not no: it may be stored all the same
                self.doubt(Doubt(batch, after, floor, epoch))
            raise
        finally:
            del self._since[token]
            self._appending[floor] -= 1
            if not self._appending[floor]:
                del self._appending[floor]

    def doubt(self, doubt: Doubt) -> None:
        """Hold a batch that may be stored without the ledger having folded it: settled before the function's next
        decision, and no snapshot of its partition claims past it meanwhile."""
        if (earlier := self.doubtful.get(doubt.batch.key)) is not None:
            doubt = doubt._replace(floor=min(doubt.floor, earlier.floor))
        self.doubtful[doubt.batch.key] = doubt

    def _writes(self, key: str, epoch: int) -> bool:
        """Whether a batch of `key` decided in `epoch` may still be sent: the partition still this node's, within
        its lease's renewal deadline, and not given up since."""
        return self.epoch(key) == epoch and self.decides(key)

    async def settle(self, key: str, now: int) -> bool:
        """Resolve the function's doubtful batch, if any: whether there was one (its state may have changed).

        Decided within the partition's current epoch, it is appended again, after the same batch as first:
        that stores it, or conflicts with it (then the catch-up folds it). A read alone could not tell: JetStream
        may answer it before it stores a publish sent earlier. Decided within an epoch since ended (the lease
        lapsed or went elsewhere meanwhile), it is never sent again: a fence (an empty batch) after the last batch
        the ledger holds settles it instead, stored only if the doubtful batch was not, and can never be after.
        """
        doubt = self.doubtful.get(key)
        if doubt is None:
            return False
        if doubt.epoch == self.epoch(key):
            batch, after = doubt.batch, doubt.after
        else:
            batch = Batch(key=key, at_ms=now, cause=FENCE, events=[], wake_ms=self.ledger.wake.get(key))
            after = self.ledger.last_seq.get(key, 0)
        try:
            seq = await self.append(batch, after)
        except Conflict:
            await self.catch_up(key)
        else:
            if after == self.ledger.last_seq.get(key, 0):
                self.ledger.fold(seq, batch)
            else:  # the ledger moved on meanwhile (a reload): the stream says where this batch stands
                await self.catch_up(key)
        if self.doubtful.get(key) is doubt:
            del self.doubtful[key]
        return True

    def stored_unseen(self, batch: Batch, after: int, epoch: int) -> None:
        """A batch stored while its partition was given up (and maybe loaded again): the ledger did not take it, and
        a load may have read the stream before it was stored. Settled as a doubt from an ended epoch is."""
        self.doubt(Doubt(batch, after, self.ledger.seq, epoch))

    async def catch_up(self, key: str) -> None:
        """Fold the function's batches after the last one the ledger holds: another writer's, or our own lost ack.

        Or retention dropped the function's last batch (it was idle a long time): its state holds
        it, and the next append expects what the stream still has of the function (nothing). Told
        apart from a loss by the stream's first sequence: a batch we hold that the stream should
        still keep, yet does not, is a loss (StoreLost), never absorbed.
        """
        token = next(self._tokens)
        self._since[token] = time.monotonic()  # a read stalled on the store is the store's trouble too
        try:
            await self.store.read(self.ledger.fold, function_events(key), self.ledger.last_seq.get(key, 0))
            stored = await self.store.last_seq(function_events(key))
            held = self.ledger.last_seq.get(key, 0)
            first = await self.store.first_seq() if stored < held else 0
        except (NatsError, TimeoutError, Unavailable) as e:
            self._trouble_at = time.monotonic()
            raise Unavailable(f"event store unavailable: {type(e).__name__}") from e
        finally:
            del self._since[token]
        if stored < held:
            if held >= first:
                raise StoreLost(f"{key}'s last batch in EVENTS is seq {stored:,}, but this node holds seq {held:,}"
                                f" and the stream keeps everything from seq {first:,}")  # fmt: skip
            self.ledger.expire(key, stored)

    def forget(self, partitions: set[int]) -> None:
        """Given up: what this node decided for them and has not stored is never sent again (their epoch ends).
        Their doubtful batches stay, to be settled by a fence should the node write them again."""
        for p in partitions:
            self._epochs[p] += 1

    def in_doubt(self, partitions: set[int]) -> list[str]:
        """The functions of those partitions that have a doubtful batch to settle."""
        return [k for k in self.doubtful if partition(k) in partitions]

    def floor(self, otherwise: int, partitions: set[int] | None = None) -> int:
        """The lowest ledger sequence an append under way began at, or a doubtful batch of those partitions (all
        when None) was sent at; `otherwise` when none is: a batch stored and not yet applied lies above it."""
        doubts = (d.floor for d in self.doubtful.values() if partitions is None or partition(d.batch.key) in partitions)
        return min(min(self._appending, default=otherwise), min(doubts, default=otherwise))

    def troubled(self, backlog_s: float, own_lag_s: float = 0.0) -> bool:
        """The event store is away or slow, so a backlog `backlog_s` old is the store's: an append or a read
        failed lately (or within the backlog's age), or one has been under way for half that age (a second at
        most). An append's time counts beyond `own_lag_s`, how late our own event loop runs: an ack we were too
        busy to read is our slowness, not the store's."""
        now = time.monotonic()
        if now - self._trouble_at < max(STORE_TROUBLE_S, backlog_s) or not self.store.nc.is_connected:
            return True
        stalled = now - min(self._since.values()) - own_lag_s if self._since else 0.0
        return stalled > min(SLOW_APPEND_S, backlog_s / 2)
