"""Snapshots of the controller's state in sqlite, so that a start replays only what came after.

A snapshot is an optimisation and never a source of truth: deleting the file changes nothing but
start time. That holds because a snapshot is used only when it is certainly right:
- it is stamped with the shape of the state (`shape`): the msgspec schema of what it stores,
  the source of the lifecycle fold (`controller/core/state.py`) and the version of the features
  fold (`controller/core/features.VERSION`). Any change there makes old snapshots unreadable by
  design, so they are ignored (full replay), never misread. The features fold is stamped by its
  version, not its source: tidying it keeps snapshots; changing what it computes bumps the
  version (a test pins its results per version), because a snapshot's features folded by the
  old rules would differ from a replay's, and `scaler replay --verify` would rightly say so;
- it is stamped with the EVENTS stream it was taken from (its creation time): a snapshot of
  another store is ignored;
- `seq` is a low watermark: every batch at or below it is in `states`. Batches above it may be in
  too; `last_seq` (per function, the last batch folded into its state) tells which, so replay
  after the snapshot skips those and folds the rest.
"""

import hashlib
import inspect
import logging
from pathlib import Path
from types import ModuleType

import aiosqlite
import msgspec

from controller.core import features, state
from controller.core.state import FnState

log = logging.getLogger("scaler.controller.snapshots")


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    stream: str
    last_seq: dict[str, int]
    states: dict[str, FnState]


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
KEEP = 3  # snapshots kept: the newest few, in case the newest is unreadable

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Snapshot)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shape TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    taken_at TEXT NOT NULL DEFAULT (datetime('now')),
    body BLOB NOT NULL
)
"""


class SnapshotStore:
    """The controller's snapshot file: written in the background, read once at start."""

    def __init__(self, path: str | Path, keep: int = KEEP) -> None:
        self.path = Path(path)
        self.keep = keep
        self._db: aiosqlite.Connection | None = None

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute(_SCHEMA)
        await self._db.commit()

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def save(self, snapshot: Snapshot) -> int:
        """Store a snapshot and drop all but the newest few; returns its size in bytes."""
        assert self._db is not None
        body = _encoder.encode(snapshot)
        await self._db.execute(
            "INSERT INTO snapshots (shape, stream, seq, body) VALUES (?, ?, ?, ?)",
            (SHAPE, snapshot.stream, snapshot.seq, body),
        )
        await self._db.execute(
            "DELETE FROM snapshots WHERE id NOT IN (SELECT id FROM snapshots ORDER BY id DESC LIMIT ?)", (self.keep,)
        )
        await self._db.commit()
        return len(body)

    async def load(self, stream: str, stream_last_seq: int) -> Snapshot | None:
        """The newest snapshot usable for this stream, or None (then the whole stream is replayed)."""
        assert self._db is not None
        async with self._db.execute("SELECT id, shape, stream, seq, body FROM snapshots ORDER BY id DESC") as rows:
            async for row_id, stamp, of_stream, seq, body in rows:
                if stamp != SHAPE:
                    log.info("snapshot %s ignored: taken by a version with another state shape", row_id)
                elif of_stream != stream:
                    log.info("snapshot %s ignored: taken from another EVENTS stream", row_id)
                elif seq > stream_last_seq:
                    log.warning("snapshot %s ignored: ahead of the stream (%s > %s)", row_id, seq, stream_last_seq)
                else:
                    try:
                        return _decoder.decode(body)
                    except msgspec.DecodeError as e:
                        log.warning("snapshot %s ignored: unreadable (%s)", row_id, e)
        return None
