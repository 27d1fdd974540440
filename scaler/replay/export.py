"""`scaler replay --sqlite FILE`: every decision of a replayed stream, one row per event with its reason,
in a SQLite file (the kind `scaler simulate --save-run FILE.sqlite` and `scaler sweep` keep their runs in)."""

import aiosqlite

from scaler.proto.events import Batch
from scaler.replay import explain

SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    source TEXT NOT NULL,     -- where it was replayed from (NATS URL or data dir)
    seq INTEGER NOT NULL,     -- the batch's stream sequence
    decision INTEGER NOT NULL, -- which decision of the batch (a group commit holds several)
    n INTEGER NOT NULL,       -- which event of the decision
    key TEXT NOT NULL,        -- the function (metaKey)
    at_ms INTEGER NOT NULL,   -- when it was decided, epoch ms
    cause TEXT NOT NULL,      -- the command that led to it (assign:r1, idle:r1, tick, ...)
    event TEXT NOT NULL,      -- the event's kind (SlotWanted, KeptAlive, ...)
    instance_id TEXT,
    request_id TEXT,
    reason TEXT,              -- the policy's or the core's reason, as the event carries it
    text TEXT NOT NULL,       -- the event in words, as `scaler replay --key K` prints it
    PRIMARY KEY (source, seq, decision, n)
);
CREATE INDEX IF NOT EXISTS decisions_by_key ON decisions (key, at_ms);
"""
COLUMNS = ("source", "seq", "decision", "n", "key", "at_ms", "cause", "event", "instance_id", "request_id")
COLUMNS += ("reason", "text")


class Decisions:
    """A `seen` callback for replay: each batch's events as rows."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: list[tuple] = []

    def __call__(self, seq: int, b: Batch) -> None:
        for d, decision in enumerate(b.decisions()):
            for n, e in enumerate(decision.events):
                reason = getattr(e, "reason", None) or getattr(e, "why", None) or None
                instance = getattr(e, "instance_id", None) or None
                request = getattr(e, "request_id", None) or getattr(e, "for_request", None) or None  # a start's
                row = (self.source, seq, d, n, decision.key, decision.at_ms, decision.cause, type(e).__name__)
                self.rows.append((*row, instance, request, reason, explain.event(e)))


async def write(path: str, rows: list[tuple]) -> None:
    """Add the rows; a stream replayed again from the same source replaces its rows, not doubles them."""
    async with aiosqlite.connect(path) as db:
        await db.executescript(SCHEMA)
        marks = ", ".join("?" * len(COLUMNS))
        await db.executemany(f"INSERT OR REPLACE INTO decisions ({', '.join(COLUMNS)}) VALUES ({marks})", rows)
        await db.commit()
