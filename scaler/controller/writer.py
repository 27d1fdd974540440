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
from collections.abc import Callable

from nats.errors import Error as NatsError

from scaler.controller.ledger import Ledger
from scaler.proto.events import Batch, encode_batch
from scaler.proto.subjects import event_subject, function_events
from scaler.runtime.bus import Unavailable
from scaler.store import Append, Conflict, EventStore, TooBig

__all__ = ["Conflict", "StoreLost", "TooBig", "Writer"]

APPEND_PATIENCE_S = 10.0  # how long an append is retried while JetStream does not answer (a cluster's failover)
STORE_TROUBLE_S = 5.0  # an append failed to reach JetStream this recently: the store is in trouble
SLOW_APPEND_S = 1.0  # an append under way this long: the store is slow, whatever waits behind it


class StoreLost(Unavailable):
    """EVENTS holds less than this node folded, and not by retention: batches were lost (an older copy of the
    store, a store emptied or replaced). The state is not to be trusted until reloaded from the stream."""


class Writer:
    def __init__(
        self, store: EventStore, ledger: Ledger, owns: Callable[[str], bool], patience_s: float = APPEND_PATIENCE_S
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.owns = owns  # whether a function is still ours to write (an append is retried only while it is)
        self.patience_s = patience_s
        self.doubtful: dict[str, Batch] = {}  # by function: a batch whose append got no answer (see settle)
        self._appending: dict[int, int] = {}  # appends in flight, by the ledger's `seq` when each began
        self._since: dict[int, float] = {}  # appends under way: when each began (monotonic)
        self._tokens = itertools.count()
        self._trouble_at = -1e9  # when an append last failed to reach JetStream (monotonic)

    async def append(self, batch: Batch) -> int:
        """Store `batch` after the function's last batch the ledger knows; its stream sequence.

        Conflict: another batch came first (fold it with `catch_up`). TooBig: no NATS message can
        hold it. Unavailable: JetStream did not answer in time; the batch is then doubtful. So is
        one whose caller stopped waiting: what was sent may be stored all the same, and a decision
        taken without it (the Cancel of that caller's Assign) might append nothing to conflict with.
        """
        floor = self.ledger.seq  # a snapshot's watermark stays below this append until it is applied
        self._appending[floor] = self._appending.get(floor, 0) + 1
        token = next(self._tokens)
        self._since[token] = time.monotonic()
        try:
            return await self._publish(batch)
        except asyncio.CancelledError:
            self.doubtful[batch.key] = batch
            raise
        finally:
            del self._since[token]
            self._appending[floor] -= 1
            if not self._appending[floor]:
                del self._appending[floor]

    async def _publish(self, batch: Batch) -> int:
        """The append itself, repeated while JetStream does not answer. A repeat is safe: the expected
        sequence makes it a conflict when the first was stored after all."""
        subject, data = event_subject(batch.key, batch.effects), encode_batch(batch)
        last = self.ledger.last_seq.get(batch.key, 0)
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + self.patience_s, 0.05
        while True:
            try:
                return await self.store.append(Append(subject, data, function_events(batch.key), last))
            except Unavailable:
                self._trouble_at = time.monotonic()
                if loop.time() + delay > deadline or not self.owns(batch.key):
                    self.doubtful[batch.key] = batch  # no answer is not no: it may be stored all the same
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def settle(self, key: str) -> bool:
        """Resolve the function's doubtful batch, if any: whether there was one (its state may have changed).

        Appending it again stores it or conflicts with it (then the catch-up folds it). A read alone
        could not tell: JetStream may answer it before it stores a publish sent earlier.
        """
        batch = self.doubtful.get(key)
        if batch is None:
            return False
        try:
            seq = await self.append(batch)
        except Conflict:
            await self.catch_up(key)
        else:
            self.ledger.fold(seq, batch)
        self.doubtful.pop(key, None)
        return True

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

    def forget(self, keys: Callable[[str], bool]) -> None:
        """Drop the doubtful batches of functions no longer ours: their next owner reads the stream."""
        self.doubtful = {k: b for k, b in self.doubtful.items() if not keys(k)}

    def floor(self, otherwise: int) -> int:
        """The lowest ledger sequence an append under way began at (`otherwise` when none is): a batch
        stored and not yet applied lies above it."""
        return min(self._appending, default=otherwise)

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
