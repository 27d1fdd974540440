"""The event store as one object: EVENTS on JetStream, each function's batches in order, each stored once.

Its verbs are an event store's (rita's shape): `ensure` the stream exists as configured, `append` one
function's batch after the last one it expects (`append_many` for several functions at once), `read`
in order, `last_seq`, what is `kept` (retention drops the oldest batches), the `retention` set on it,
and which `incarnation` it is. Its errors are three: `Conflict` (another batch came first), `TooBig`
(no message can hold the batch) and `Unavailable` (JetStream did not take it: it may be stored all the
same). The controller's writer is the one part that appends; the rebuild and `scaler replay` read.
"""

from nats.aio.client import Client
from nats.js.api import StreamConfig

from scaler.proto.subjects import EVENTS
from scaler.store import config, stream
from scaler.store.commits import SHARE_FROM_LONE, Commits
from scaler.store.config import Retention
from scaler.store.stream import ALL, Append, Kept, OnBatch, OnStamp

APPEND_TIMEOUT_S = 5.0


class EventStore:
    def __init__(self, nc: Client, timeout_s: float = APPEND_TIMEOUT_S, writer: str = "") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.timeout_s = timeout_s
        self.writer = writer  # the node that appends through it, named on each batch (whose clock its times are on)
        self.commits = Commits(nc, timeout_s, atomic=False, writer=writer)  # atomic once `ensure` finds it takes it

    @property
    def room(self) -> int:
        """Bytes of batch one append may carry (NATS's payload limit, less the headers)."""
        return self.nc.max_payload - stream.HEADERS_ROOM

    def fits(self, size: int) -> None:
        """TooBig when a batch of `size` bytes is more than one message holds."""
        stream.fits(size, self.nc.max_payload)

    async def ensure(self, replicas: int = 1, retention: Retention | None = None) -> StreamConfig:
        """Create EVENTS or bring it to this configuration (config.ensure); check the server and the layout.

        A server that takes atomic batches (2.12+) gets a stream that allows them, and appends of
        different functions that meet share one commit (store/commits.py): on a replicated stream as soon
        as one is on its way, on a lone server's only once many are."""
        stream.check_server(self.nc)
        configured = await config.ensure_stream(self.js, replicas, retention, atomic=stream.takes_atomic(self.nc))
        await stream.check_layout(self.js)
        self.commits.atomic = bool(configured.allow_atomic)
        self.commits.share_from = 1 if (configured.num_replicas or 1) > 1 else SHARE_FROM_LONE
        return configured

    async def append(self, a: Append) -> int:
        """Store one function's batch after its expected last sequence; its stream sequence."""
        return await self.commits.store(a)

    async def append_many(self, appends: list[Append]) -> list[int]:
        """Several functions' batches, all or none (an atomic batch): their stream sequences, in order."""
        return await stream.append_all(self.nc, appends, self.timeout_s, self.writer)

    async def read(
        self,
        on_batch: OnBatch,
        subject: str = ALL,
        after_seq: int = 0,
        until_seq: int | None = None,
        on_stamp: OnStamp | None = None,
    ) -> int:
        """Every batch on `subject` after `after_seq` up to `until_seq` (or the last when the read starts), in order;
        `on_stamp` is told each one's server stamp."""
        return await stream.read(self.js, on_batch, subject, after_seq, until_seq, on_stamp)

    async def last_seq(self, subject: str = ALL) -> int:
        return await stream.last_seq(self.js, subject)

    async def first_seq(self) -> int:
        return (await self.js.stream_info(EVENTS)).state.first_seq

    async def kept(self) -> Kept:
        return await stream.kept(self.js)

    async def incarnation(self) -> str:
        return await stream.stream_id(self.js)

    async def retention(self) -> Retention:
        return config.retention_of((await self.js.stream_info(EVENTS)).config)

    async def set_retention(self, retention: Retention) -> bool:
        return await config.set_retention(self.js, retention)
