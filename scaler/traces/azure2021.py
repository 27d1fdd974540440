"""Azure Functions 2021 (the invocation trace of "Faster and Cheaper Serverless Computing on Harvested
Resources", SOSP'21): one row per invocation over two weeks, `app,func,end_timestamp,duration`, both
in seconds (AzureFunctionsInvocationTrace2021.md). Each request starts at end_timestamp - duration and
runs for duration; the trace has neither memory nor init times (docs/traces.md).

The file is known by its columns: Azure's own, or an excerpt in the same columns under another name
(vHive's In-Vitro ships `Azure2021_30.csv`, `Azure2021_200.csv`; its sampler writes `SampledAzure2021.csv`).
"""

from collections import defaultdict
from pathlib import Path

from scaler.traces import azure2019
from scaler.traces.azure2019 import key
from scaler.traces.build import Function, TraceError
from scaler.traces.csvfile import header, number, table

FILE = "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt"
COLUMNS = ("app", "func", "end_timestamp", "duration")
BASE_MS = 1_612_051_200_000  # 2021-01-31 00:00 UTC, the trace's first day; its timestamps count from there


def read(src: Path, window: tuple[int, int] | None) -> tuple[list[Function], int, str]:
    """Every function's invocations (those starting in the window, ms from the trace's 0), the epoch ms
    the window starts at, and the file read. SRC is the trace's file, or the folder holding it."""
    path = find(src)
    if what := azure2019.kind(header(path)):
        raise TraceError(f"{path}: an Azure 2019 {what} file: scaler trace import azure2019")
    t = table(path, *COLUMNS)
    app, fn, end, took = (t.column(c) for c in COLUMNS)
    lo, hi = window or (0, 1 << 62)
    calls: dict[str, list[tuple[int, int]]] = defaultdict(list)
    keys: dict[str, tuple[str, str]] = {}
    for line, row in t.rows():
        duration_s = number(t, line, row[took], "duration")
        start = round((number(t, line, row[end], "end_timestamp") - duration_s) * 1000)
        if not lo <= start < hi:
            continue
        k = key(row[app], row[fn])
        if keys.setdefault(k, (row[app], row[fn])) != (row[app], row[fn]):
            raise TraceError(f"{t.path}:{line}: two functions share the key {k}")
        calls[k].append((start - lo, max(round(duration_s * 1000), 0)))
    return [_function(k, sorted(c)) for k, c in calls.items()], BASE_MS + lo, f"read {path.name}"


def find(src: Path) -> Path:
    """SRC itself, or the one file in the folder SRC with the trace's columns (Azure's name first)."""
    if not src.is_dir():
        return src
    if (src / FILE).is_file():
        return src / FILE
    found = [
        p
        for p in sorted(src.iterdir())
        if p.is_file() and p.suffix in (".csv", ".txt") and set(COLUMNS) <= set(header(p))
    ]
    if len(found) != 1:
        names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
        raise TraceError(
            f"{src}: {len(found)} files of the trace ({names}): give one as SRC"
            if found
            else f"{src}: no file with the columns {','.join(COLUMNS)}"
        )
    return found[0]


def _function(k: str, calls: list[tuple[int, int]]) -> Function:
    return Function(k, len(calls), lambda rng: calls)
