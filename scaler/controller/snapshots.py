"""Snapshots of each partition's state, in a JetStream object store: a start or a take-over replays only what followed.

Kept in NATS beside the stream, so whichever node takes a partition over (on any machine) reads
its snapshot, and the stream may drop what every snapshot already holds (its retention). A
snapshot is an optimisation and never a source of truth while the stream still holds everything:
deleting the bucket changes nothing but start time. That holds because a snapshot is used only
when it is certainly right:
- it holds two bodies, each stamped with its own version: the lifecycle states (`body`,
  `scaler/controller/core/state.VERSION`, which covers the schema and the lifecycle fold) and the
  functions' features (`features_body`, `scaler/controller/core/features.VERSION`, the policy layer's),
  so a new feature never bumps the lifecycle's version. (Before state version 11 the features were
  inside the states, in one body; the upcast splits them.) An older state version is upcast
  (scaler/controller/upcasts.py), so an upgrade keeps every snapshot; a newer one (a downgrade) is
  ignored, never misread. The features are folded from events, so
  they cannot be recomputed from a snapshot: a features version that only adds histories carries
  on from the earlier one's (`upcasts.FEATURES_CONTINUED`, the new histories starting empty); a
  snapshot of any other features version is ignored (full replay), which is why a test pins the
  features' results per version and a change there bumps it. Version 1 was
  stamped by a hash of the schema and the fold's source (`V1_SHAPES`);
- it is stamped with the EVENTS stream it was taken from (its creation time): a snapshot of
  another store is ignored;
- `seq` is a low watermark: every batch of the partition at or below it is in `states`. Batches
  above it may be in too; `last_seq` (per function, the last batch folded into its state) tells
  which, so replay after the snapshot skips those and folds the rest.
Once retention has dropped batches, a partition's snapshot is the only record of them: it is then
used by `scaler replay` too, and a partition without one that reaches back to the stream's first
batch is refused (scaler/controller/rebuild.py).
"""

import asyncio
import logging

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, DigestMismatchError, NotFoundError, ObjectNotFoundError

from scaler.controller.core import features, state
from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState
from scaler.controller.upcasts import FEATURES_CONTINUED, upcast

log = logging.getLogger("scaler.controller.snapshots")

BUCKET = "scaler_snapshots"
READ_S = 10.0  # how long a snapshot's read may take, plus READ_BYTES_S for each byte of it
READ_BYTES_S = 1 / 10e6  # (10 MB a second: a snapshot of 100,000 functions is tens of MB)
REREADS = 3  # reads of an object its owner keeps replacing meanwhile, before it is read from the stream instead


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    stream: str
    last_seq: dict[str, int]
    states: dict[str, FnState]
    features: dict[str, FnStats] = {}  # each function's features (none: nothing learned yet), folded beside its state
    wake: dict[str, int] = {}  # each function's next deadline (clock ms)
    at_ms: int = 0  # when it was taken (clock ms): it holds no batch decided after that


class _Lifecycle(msgspec.Struct, frozen=True, kw_only=True):
    """The lifecycle body: the snapshot without its features (stamped with state.VERSION)."""

    seq: int
    stream: str
    last_seq: dict[str, int]
    states: dict[str, FnState]
    wake: dict[str, int] = {}
    at_ms: int = 0


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """What the object holds: the stamps, readable whatever the version, then the snapshot."""

    shape: str  # version 1's stamp (a hash); "" since
    stream: str
    seq: int
    body: bytes  # the lifecycle (`_Lifecycle`; before version 11, the whole snapshot, features inside its states)
    version: int = 1  # scaler/controller/core/state.VERSION of the body
    features: int = 0  # scaler/controller/core/features.VERSION of the features (version 1: in `shape`)
    features_body: bytes = b""  # each function's features, by key (since version 11)


V1_SHAPES = {"88aab271c3044262": 2}  # version 1's stamp -> the features version it stood for
FEATURES_APART = 11  # the state version from which the features are a body of their own


_encoder = msgspec.msgpack.Encoder()
_stored = msgspec.msgpack.Decoder(_Stored)
_lifecycle = msgspec.msgpack.Decoder(_Lifecycle)
_features = msgspec.msgpack.Decoder(dict[str, FnStats])


def _lifecycle_of(snapshot: Snapshot) -> _Lifecycle:
    return _Lifecycle(
        seq=snapshot.seq,
        stream=snapshot.stream,
        last_seq=snapshot.last_seq,
        states=snapshot.states,
        wake=snapshot.wake,
        at_ms=snapshot.at_ms,
    )


def _joined(lifecycle: _Lifecycle, learned: dict[str, FnStats]) -> Snapshot:
    return Snapshot(
        seq=lifecycle.seq,
        stream=lifecycle.stream,
        last_seq=lifecycle.last_seq,
        states=lifecycle.states,
        features=learned,
        wake=lifecycle.wake,
        at_ms=lifecycle.at_ms,
    )


def name(partition: int) -> str:
    return f"p{partition}"


class SnapshotStore:
    def __init__(self, js: JetStreamContext, replicas: int = 1) -> None:
        self.js = js
        self.replicas = replicas
        self._store = None
        self._torn: set[tuple[int, str]] = set()  # (partition, object) found torn: said once

    async def open(self, create: bool = True) -> None:
        """Open the bucket, created if missing (without `create`, a missing bucket holds no snapshot)."""
        try:
            self._store = await self.js.object_store(BUCKET)
        except (BucketNotFoundError, NotFoundError):
            if create:
                config = ObjectStoreConfig(bucket=BUCKET, storage=StorageType.FILE, replicas=self.replicas)
                self._store = await self.js.create_object_store(BUCKET, config=config)

    async def save(self, partition: int, snapshot: Snapshot) -> int:
        """Store the partition's snapshot in place of the one before; returns its size in bytes."""
        stored = _Stored(
            shape="",
            stream=snapshot.stream,
            seq=snapshot.seq,
            body=_encoder.encode(_lifecycle_of(snapshot)),
            version=state.VERSION,
            features=features.VERSION,
            features_body=_encoder.encode(snapshot.features),
        )
        body = _encoder.encode(stored)
        await self._store.put(name(partition), body)
        return len(body)

    async def load(self, partition: int, stream: str, stream_last_seq: int) -> Snapshot | None:
        """The partition's snapshot if it is usable for this stream, else None (then its batches are all read)."""
        data = await self._read(partition)
        if data is None:
            return None
        try:
            stored = _stored.decode(data)
        except msgspec.DecodeError as e:
            log.warning("snapshot of partition %d ignored: unreadable (%s)", partition, e)
            return None
        version, features_version = stored.version, stored.features
        if version == 1:
            features_version = V1_SHAPES.get(stored.shape, 0)
        if version > state.VERSION:
            log.info("snapshot of partition %d ignored: taken by a newer version (state v%d)", partition, version)
        elif features_version != features.VERSION and features_version not in FEATURES_CONTINUED:
            log.info("snapshot of partition %d ignored: its features were folded by other rules", partition)
        elif stored.stream != stream:
            log.info("snapshot of partition %d ignored: taken from another EVENTS stream", partition)
        elif stored.seq > stream_last_seq:
            log.warning("snapshot of partition %d ignored: ahead of the stream (%d > %d)", partition, stored.seq,
                        stream_last_seq)  # fmt: skip
        else:
            try:
                if version == state.VERSION:
                    return _joined(_lifecycle.decode(stored.body), _features.decode(stored.features_body))
                if version >= FEATURES_APART:  # the lifecycle upcast, the features beside it as they are
                    return _joined(upcast(stored.body, version, _Lifecycle), _features.decode(stored.features_body))
                return upcast(stored.body, version, Snapshot)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("snapshot of partition %d ignored: unreadable (%s)", partition, e)
        return None

    async def _read(self, partition: int) -> bytes | None:
        """The partition's object, or None: none, or torn (a chunk missing or its digest wrong), said once per object.

        The chunks are counted before they are read: the object store's reader waits forever for a missing one.
        An object replaced while it was read (its owner snapshotted meanwhile) is read again.
        """
        if self._store is None:
            return None
        for _ in range(REREADS):
            try:
                info = await self._store.get_info(name(partition))
            except (ObjectNotFoundError, NotFoundError):
                return None
            chunks = f"$O.{BUCKET}.C.{info.nuid}"
            held = (await self.js.stream_info(f"OBJ_{BUCKET}", subjects_filter=chunks)).state.subjects or {}
            if held.get(chunks, 0) == info.chunks:
                # A read whose consumer's server dies (a cluster's failover) is never delivered to again: bounded,
                # it fails the load, which gives the partition back to be taken again, rather than hold it unloaded.
                try:
                    async with asyncio.timeout(READ_S + info.size * READ_BYTES_S):
                        return (await self._store.get(name(partition))).data
                except DigestMismatchError:
                    pass
                except TimeoutError:
                    if not await self._replaced(partition, info.nuid):
                        raise TimeoutError(
                            f"reading partition {partition}'s snapshot ({info.size:,} bytes) stalled"
                        ) from None
                    continue
            if await self._replaced(partition, info.nuid):
                continue
            if (partition, info.nuid) not in self._torn:
                self._torn.add((partition, info.nuid))
                log.warning(
                    "snapshot of partition %d ignored: torn (%d of %d chunks, or its digest does not match); its"
                    " batches are read from the stream",
                    partition, held.get(chunks, 0), info.chunks,
                )  # fmt: skip
            return None
        return None

    async def _replaced(self, partition: int, nuid: str) -> bool:
        """Whether the partition's object is another than `nuid` now (written again while it was read)."""
        try:
            return (await self._store.get_info(name(partition))).nuid != nuid
        except (ObjectNotFoundError, NotFoundError):
            return False
