"""Snapshots of each partition's state, in a JetStream object store: a start or a take-over replays only what followed.

Kept in NATS beside the stream, so whichever node takes a partition over (on any machine) reads
its snapshot, and the stream may drop what every snapshot already holds (its retention). A
snapshot is an optimisation and never a source of truth while the stream still holds everything:
deleting the bucket changes nothing but start time. That holds because a snapshot is used only
when it is certainly right:
- it is stamped with the shape of the state (`shape`): the msgspec schema of what it stores,
  the source of the lifecycle fold (`controller/core/state.py`) and the version of the features
  fold (`controller/core/features.VERSION`). Any change there makes old snapshots unreadable by
  design, so they are ignored (full replay), never misread. The features fold is stamped by its
  version, not its source: tidying it keeps snapshots; changing what it computes bumps the
  version (a test pins its results per version), because a snapshot's features folded by the
  old rules would differ from a replay's, and `scaler replay --verify` would rightly say so;
- it is stamped with the EVENTS stream it was taken from (its creation time): a snapshot of
  another store is ignored;
- `seq` is a low watermark: every batch of the partition at or below it is in `states`. Batches
  above it may be in too; `last_seq` (per function, the last batch folded into its state) tells
  which, so replay after the snapshot skips those and folds the rest.
Once retention has dropped batches, a partition's snapshot is the only record of them: it is then
used by `scaler replay` too, and a partition without one that reaches back to the stream's first
batch is refused (controller/rebuild.py).
"""

import hashlib
import inspect
import logging
from pathlib import Path
from types import ModuleType

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from controller.core import features, state
from controller.core.state import FnState

log = logging.getLogger("scaler.controller.snapshots")

BUCKET = "scaler_snapshots"


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    stream: str
    last_seq: dict[str, int]
    states: dict[str, FnState]
    wake: dict[str, int] = {}  # each function's next deadline (clock ms)
    at_ms: int = 0  # when it was taken (clock ms): it holds no batch decided after that


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """What the object holds: the stamps, readable whatever the shape, then the snapshot."""

    shape: str
    stream: str
    seq: int
    body: bytes


def shape(schema: bytes, lifecycle: bytes, features_version: int) -> str:
    """The stamp of what a snapshot holds: its schema, the lifecycle fold's source, the features fold's version."""
    return hashlib.sha256(b"\0".join((schema, lifecycle, str(features_version).encode()))).hexdigest()[:16]


def _source(module: ModuleType) -> bytes:
    try:
        return inspect.getsource(module).encode()
    except (OSError, TypeError):  # installed without sources: the compiled module stands for them
        return Path(module.__file__).read_bytes()


def current_shape() -> str:
    """The stamp of the code running now."""
    return shape(msgspec.json.encode(msgspec.json.schema(Snapshot)), _source(state), features.VERSION)


SHAPE = current_shape()

_encoder = msgspec.msgpack.Encoder()
_stored = msgspec.msgpack.Decoder(_Stored)
_snapshot = msgspec.msgpack.Decoder(Snapshot)


def name(partition: int) -> str:
    return f"p{partition}"


class SnapshotStore:
    def __init__(self, js: JetStreamContext, replicas: int = 1) -> None:
        self.js = js
        self.replicas = replicas
        self._store = None

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
        body = _encoder.encode(
            _Stored(shape=SHAPE, stream=snapshot.stream, seq=snapshot.seq, body=_encoder.encode(snapshot))
        )
        await self._store.put(name(partition), body)
        return len(body)

    async def load(self, partition: int, stream: str, stream_last_seq: int) -> Snapshot | None:
        """The partition's snapshot if it is usable for this stream, else None (then its batches are all read)."""
        if self._store is None:
            return None
        try:
            found = await self._store.get(name(partition))
        except (ObjectNotFoundError, NotFoundError):
            return None
        try:
            stored = _stored.decode(found.data)
        except msgspec.DecodeError as e:
            log.warning("snapshot of partition %d ignored: unreadable (%s)", partition, e)
            return None
        if stored.shape != SHAPE:
            log.info("snapshot of partition %d ignored: taken by a version with another state shape", partition)
        elif stored.stream != stream:
            log.info("snapshot of partition %d ignored: taken from another EVENTS stream", partition)
        elif stored.seq > stream_last_seq:
            log.warning("snapshot of partition %d ignored: ahead of the stream (%d > %d)", partition, stored.seq,
                        stream_last_seq)  # fmt: skip
        else:
            try:
                return _snapshot.decode(stored.body)
            except msgspec.DecodeError as e:
                log.warning("snapshot of partition %d ignored: unreadable (%s)", partition, e)
        return None
