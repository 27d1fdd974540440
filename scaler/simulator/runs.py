"""Runs kept in one SQLite file: `scaler simulate --save-run FILE.sqlite`, every point of `scaler sweep`,
and (`scaler replay --sqlite`) the decisions of a replayed stream, beside them in their own table.

Two tables a person can ask SQL of (docs/simulation.md, "Runs in SQLite"): `runs`, one row per run
(its trace, policy, knobs, the code's commit, and every statistic under its name in `Stats`), and
`functions`, one row per function of each run (its figures, as the worst-functions table). A run
saved to be compared keeps its page's data (statistics, functions, timelines) in `runs.saved`,
compressed JSON, which `--compare FILE.sqlite[:ID]` reads back.
"""

import datetime
import json
import subprocess
import urllib.parse
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiosqlite
import msgspec

from scaler.simulator.saved import SavedRun, load, save
from scaler.simulator.score import FunctionRow, Stats

STATS = [f for f in msgspec.structs.fields(Stats)]
FUNCTION_COLUMNS = (
    "key",
    "requests",
    "cold_starts",
    "cold_start_rate",
    "schedule_secs",
    "idle_secs",
    "wait_p50_ms",
    "wait_p99_ms",
    "wait_max_ms",
    "execution_g_bs",
    "slot_g_bs",
    "wasted_g_bs",
    "lost_score",
)
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    recorded TEXT NOT NULL,          -- when, UTC, ISO 8601
    trace TEXT NOT NULL,             -- the dataset's folder name
    policy TEXT NOT NULL,
    knobs TEXT NOT NULL,             -- JSON: the policy's fields set away from their defaults
    sweep TEXT,                      -- the sweep it is a point of (NULL: a run of its own)
    mode TEXT NOT NULL,              -- offline or live
    code TEXT NOT NULL,              -- the commit it ran (git describe --always --dirty), or the version
    title TEXT NOT NULL,
    {", ".join(f"{f.name} {'TEXT' if f.name == 'failures_by_cause' else 'REAL'}" for f in STATS)},
    saved BLOB                       -- zlib'd JSON of the page's data, for --compare (NULL: not kept)
);
CREATE TABLE IF NOT EXISTS functions (
    run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} {'TEXT' if c == 'key' else 'REAL'}" for c in FUNCTION_COLUMNS)},
    PRIMARY KEY (run, key)
);
CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep);
"""


class RunsError(ValueError):
    """The file cannot be read or written as a runs store; said in one line."""


@dataclass
class Record:
    """One run to keep."""

    trace: str
    policy: str
    stats: Stats
    functions: list[FunctionRow]
    knobs: dict[str, object] = field(default_factory=dict)
    mode: str = "offline"
    title: str = ""
    sweep: str | None = None
    saved: SavedRun | None = None


def is_store(path: str | Path) -> bool:
    """Whether a --save-run or --compare path names a SQLite store rather than a JSON file."""
    return Path(str(path).split(":")[0]).suffix in (".sqlite", ".sqlite3", ".db")


def code_version() -> str:
    """The commit this code is at (dirty when changed), or the package's version outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    from importlib.metadata import version

    return f"scaler {version('scaler')}"


async def _open(path: Path, write: bool = True) -> aiosqlite.Connection:
    """The store, its tables made if need be; to read, an existing file only (read-only)."""
    try:
        if not write:
            return await aiosqlite.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
        db = await aiosqlite.connect(path)
        await db.execute("PRAGMA foreign_keys = ON")
        await db.executescript(SCHEMA)
    except aiosqlite.Error as e:
        raise RunsError(f"{path}: not a runs store: {e}") from None
    return db


async def record(path: Path, runs: Iterable[Record], code: str | None = None) -> list[int]:
    """Keep the runs, in one transaction; their ids."""
    code = code or code_version()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    db = await _open(path)
    try:
        ids = []
        for r in runs:
            values = [getattr(r.stats, f.name) for f in STATS]
            values = [json.dumps(v) if isinstance(v, dict) else v for v in values]
            saved = zlib.compress(save(r.saved), 1) if r.saved is not None else None
            columns = ["recorded", "trace", "policy", "knobs", "sweep", "mode", "code", "title"]
            columns += [f.name for f in STATS] + ["saved"]
            row = [now, r.trace, r.policy, json.dumps(r.knobs, sort_keys=True), r.sweep, r.mode, code, r.title]
            cursor = await db.execute(
                f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [*row, *values, saved],
            )
            ids.append(cursor.lastrowid)
            await db.executemany(
                f"INSERT INTO functions VALUES (?, {', '.join('?' * len(FUNCTION_COLUMNS))})",
                [[cursor.lastrowid, *(getattr(f, c) for c in FUNCTION_COLUMNS)] for f in r.functions],
            )
        await db.commit()
        return ids
    except aiosqlite.Error as e:
        raise RunsError(f"{path}: cannot write: {e}") from None
    finally:
        await db.close()


async def saved_run(path: Path, run_id: int | None = None) -> SavedRun:
    """The page's data of run `run_id` (by default the newest run kept with it)."""
    db = await _open(path, write=False)
    try:
        if run_id is None:
            query, args = "SELECT id, saved FROM runs WHERE saved IS NOT NULL ORDER BY id DESC LIMIT 1", ()
        else:
            query, args = "SELECT id, saved FROM runs WHERE id = ?", (run_id,)
        row = await (await db.execute(query, args)).fetchone()
    except aiosqlite.Error as e:
        raise RunsError(f"{path}: not a runs store: {e}") from None
    finally:
        await db.close()
    if row is None:
        raise RunsError(f"{path}: no run {run_id}" if run_id is not None else f"{path}: no run saved with its page")
    if row[1] is None:
        raise RunsError(f"{path}: run {row[0]} was kept without its page (a sweep's point): save one with --save-run")
    return load(zlib.decompress(row[1]))


async def query(path: Path, sql: str, args: Iterable = ()) -> list[dict]:
    """Rows of a query, as dicts by column name."""
    db = await _open(path, write=False)
    try:
        db.row_factory = aiosqlite.Row
        return [dict(row) for row in await (await db.execute(sql, tuple(args))).fetchall()]
    finally:
        await db.close()
