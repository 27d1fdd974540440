"""Azure Functions 2019 ("Serverless in the Wild", ATC'20): per-minute invocation counts, with each
function's execution-time percentiles and its application's memory percentiles, as Azure publishes
them (one day: `invocations_per_function_md.anon.dNN.csv`, `function_durations_percentiles.anon.dNN
.csv`, `app_memory_percentiles.anon.dNN.csv`) and as vHive's In-Vitro ships its samples of them
(`invocations.csv`, `durations.csv`, `memory.csv`, the memory per function; or `N_inv.csv`,
`N_run.csv`, `N_mem.csv`, the minutes named `minute_1`.., no Trigger).

A file is known by its columns, not its name: the one with the hashes and minute columns holds the
invocations, the one with `percentile_Average_*` the durations, the one with `AverageAllocatedMb_pct*`
the memory; names only pair a day's or a sample's three files where a folder holds several. The
conversion's assumptions are in docs/traces.md.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from scaler.traces.build import MINUTE_MS, Function, Percentiles, TraceError, spread
from scaler.traces.csvfile import Table, header, number, table

INVOCATIONS = "invocations_per_function_md.anon.d{day:02}.csv"
MINUTES = 1440
DURATION_PERCENTILES = (0, 1, 25, 50, 75, 99, 100)  # percentile_Average_{q}
MEMORY_PERCENTILES = (1, 5, 25, 50, 75, 95, 99, 100)  # AverageAllocatedMb_pct{q} (the 0th was not logged)
BASE_MS = 1_563_148_800_000  # 2019-07-15 00:00 UTC: day 1 (the trace says only "July 2019")
MINUTE = re.compile(r"(?:minute_)?([1-9]\d*)")  # Azure's `1`..`1440`, In-Vitro's older `minute_1`..
# Words of the files' names that say what a file holds; what is left of a name (`d01`, `100`) pairs files.
NAME_WORDS = {"invocations", "per", "function", "md", "anon", "durations", "percentiles", "app", "memory"}
NAME_WORDS |= {"inv", "run", "dur", "mem"}


def kind(columns: list[str]) -> str | None:
    """What an Azure 2019 file holds, by its columns: "invocations", "durations", "memory" or None."""
    names = set(columns)
    if {"HashApp", "HashFunction"} <= names and any(MINUTE.fullmatch(c) for c in columns):
        return "invocations"
    if {"HashApp", "HashFunction", *(f"percentile_Average_{q}" for q in DURATION_PERCENTILES)} <= names:
        return "durations"
    if {"HashApp", *(f"AverageAllocatedMb_pct{q}" for q in MEMORY_PERCENTILES)} <= names:
        return "memory"
    return None


def key(app: str, function: str) -> str:
    """16 hex digits of the app and of the function: readable, and unique in practice (checked)."""
    return f"{app[:16]}-{function[:16]}"


@dataclass
class Files:
    """One day's (or one sample's) files."""

    invocations: Path
    durations: Path | None
    memory: Path | None
    day: int  # the trace's day (1..14); 1 for a sample, whose minutes In-Vitro takes from day 1

    def said(self) -> str:
        return "read " + ", ".join(p.name for p in (self.invocations, self.durations, self.memory) if p)


def _group(path: Path) -> str:
    """What pairs a file with its day's or sample's others: its name less the words that say its kind."""
    return "_".join(w for w in re.split(r"[._-]+", path.stem.lower()) if w and w not in NAME_WORDS)


def _day(group: str) -> int | None:
    m = re.fullmatch(r"d(\d+)", group)
    return int(m.group(1)) if m else None


def find(src: Path, day: int | None) -> Files:
    """The invocations, durations and memory files to read: SRC is a folder, or its invocations file."""
    if not src.exists():
        raise TraceError(f"{src}: no such file or folder")
    folder = src.parent if src.is_file() else src
    kinds = {p: kind(header(p)) for p in sorted(folder.iterdir()) if p.is_file() and p.suffix == ".csv"}
    if src.is_file():
        if kinds.get(src) != "invocations":
            raise TraceError(f"{src}: not an Azure 2019 invocations file{_columns(src)}")
        if day is not None:
            raise TraceError("--day: SRC is one day's (or one sample's) invocations file already")
        invocations = src
    else:
        invocations = _pick([p for p, k in kinds.items() if k == "invocations"], src, day)

    def companion(what: str) -> Path | None:
        """The file of that kind named as the invocations are (`d01`, `100`), else the only one there is."""
        of_kind = [p for p, k in kinds.items() if k == what]
        paired = [p for p in of_kind if _group(p) == _group(invocations)]
        return paired[0] if paired else of_kind[0] if len(of_kind) == 1 else None

    return Files(invocations, companion("durations"), companion("memory"), _day(_group(invocations)) or 1)


def _pick(found: list[Path], src: Path, day: int | None) -> Path:
    """A folder's invocations file: the one there is, the day asked for, or the first day."""
    if not found:
        raise TraceError(f"{src}: no Azure 2019 invocations file (columns HashApp, HashFunction, 1..1440){_other(src)}")
    days = {_day(_group(p)): p for p in found}
    if day is None and (len(found) == 1 or None not in days):
        return days[min(days)] if None not in days else found[0]
    if None in days:
        names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
        why = "holds samples, not days" if day is not None else f"holds {len(found)} samples"
        raise TraceError(f"{src}: {why} ({names}): give one's invocations file as SRC")
    if day not in days:
        present = ", ".join(str(d) for d in sorted(days))
        raise TraceError(f"{src}: no {INVOCATIONS.format(day=day)} (days present: {present})")
    return days[day]


def _columns(path: Path) -> str:
    columns = header(path)
    return f" (its columns: {', '.join(columns[:8])}{', ...' if len(columns) > 8 else ''})"


def _other(folder: Path) -> str:
    """A hint when the folder holds another trace the importer knows."""
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.suffix in (".csv", ".txt") and {"app", "func", "end_timestamp"} <= set(header(p)):
            return f"; {p.name} is an Azure 2021 trace: scaler trace import azure2021"
    return ""


def durations(path: Path) -> dict[tuple[str, str], Percentiles]:
    t = table(path, "HashApp", "HashFunction", *(f"percentile_Average_{q}" for q in DURATION_PERCENTILES))
    app, fn = t.column("HashApp"), t.column("HashFunction")
    cols = [(q, t.column(f"percentile_Average_{q}")) for q in DURATION_PERCENTILES]
    found = {}
    for line, row in t.rows():
        points = tuple((q, number(t, line, row[c], f"percentile_Average_{q}")) for q, c in cols)
        found[(row[app], row[fn])] = Percentiles(points)
    return found


def memory(path: Path | None) -> dict[tuple[str, str | None], Percentiles]:
    """Memory percentiles by (app, None) as Azure gives them, or by (app, function) as In-Vitro does."""
    if path is None:
        return {}  # Azure's days 13 and 14 have none
    t = table(path, "HashApp", *(f"AverageAllocatedMb_pct{q}" for q in MEMORY_PERCENTILES))
    app = t.column("HashApp")
    fn = t.column("HashFunction") if "HashFunction" in t.header else None
    cols = [(q, t.column(f"AverageAllocatedMb_pct{q}")) for q in MEMORY_PERCENTILES]
    found = {}
    for line, row in t.rows():
        points = tuple((q, number(t, line, row[c], f"AverageAllocatedMb_pct{q}")) for q, c in cols)
        if points[-1][1] > 0:
            found[(row[app], row[fn] if fn is not None else None)] = Percentiles(points)
    return found


def minutes(t: Table) -> list[tuple[int, int]]:
    """(column, minute of the day from 0) of every minute column: all 1440, or the excerpt a sampler kept."""
    found = [(c, int(m.group(1)) - 1) for c, name in enumerate(t.header) if (m := MINUTE.fullmatch(name))]
    if not found:
        raise TraceError(f"{t.path}: no minute columns (1..1440 or minute_1..minute_1440)")
    return found


def read(src: Path, day: int | None, window: tuple[int, int] | None) -> tuple[list[Function], int, str]:
    """The functions of a day (the first in SRC by default) or of a sample, the epoch ms the window
    starts at, and what was read and left out, said in words."""
    files = find(src, day)
    if files.durations is None:
        where = files.invocations
        raise TraceError(f"{where.parent}: no durations file (percentile_Average_*) for {where.name}")
    by_function = durations(files.durations)
    by_app = memory(files.memory)
    t = table(files.invocations, "HashApp", "HashFunction")
    app, fn = t.column("HashApp"), t.column("HashFunction")
    lo, hi = window or (0, 1 << 62)
    columns = [(c, m * MINUTE_MS) for c, m in minutes(t) if lo <= m * MINUTE_MS < hi]
    functions, keys, left_out = [], {}, 0
    for line, row in t.rows():
        run = by_function.get((row[app], row[fn]))
        if run is None:
            left_out += 1
            continue
        counts = [(start - lo, int(number(t, line, row[c], t.header[c]))) for c, start in columns]
        counts = [(start, n) for start, n in counts if n > 0]
        k = key(row[app], row[fn])
        if keys.setdefault(k, (row[app], row[fn])) != (row[app], row[fn]):
            raise TraceError(f"{t.path}:{line}: two functions share the key {k}")
        mem = by_app.get((row[app], row[fn])) or by_app.get((row[app], None))
        functions.append(_function(k, counts, run, mem))
    said = files.said() + (f"; {left_out:,} functions without duration percentiles left out" if left_out else "")
    return functions, BASE_MS + (files.day - 1) * MINUTES * MINUTE_MS + (window or (0, 0))[0], said


def _function(k: str, counts: list[tuple[int, int]], run: Percentiles, memory: Percentiles | None) -> Function:
    def requests(rng) -> list[tuple[int, int]]:
        return [(t, max(round(run.draw(rng)), 0)) for t in spread(counts, MINUTE_MS, rng)]

    return Function(k, sum(n for _, n in counts), requests, memory=memory)
