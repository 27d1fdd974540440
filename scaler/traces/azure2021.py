"""Azure Functions 2021 (the invocation trace of "Faster and Cheaper Serverless Computing on Harvested
Resources", SOSP'21): one row per invocation over two weeks, `app,func,end_timestamp,duration`, both
in seconds (AzureFunctionsInvocationTrace2021.md). Each request starts at end_timestamp - duration and
runs for duration; the trace has neither memory nor init times (docs/traces.md).
"""

from collections import defaultdict
from pathlib import Path

from scaler.traces.azure2019 import key
from scaler.traces.build import Function, TraceError
from scaler.traces.csvfile import number, table

FILE = "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt"
BASE_MS = 1_612_051_200_000  # 2021-01-31 00:00 UTC, the trace's first day; its timestamps count from there


def read(src: Path, window: tuple[int, int] | None) -> tuple[list[Function], int]:
    """Every function's invocations (those starting in the window, ms from the trace's 0), and the
    epoch ms the window starts at. SRC is the trace's file, or the folder holding it."""
    path = src / FILE if src.is_dir() else src
    t = table(path, "app", "func", "end_timestamp", "duration")
    app, fn, end, took = (t.column(c) for c in ("app", "func", "end_timestamp", "duration"))
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
    return [_function(k, sorted(c)) for k, c in calls.items()], BASE_MS + lo


def _function(k: str, calls: list[tuple[int, int]]) -> Function:
    return Function(k, len(calls), lambda rng: calls)
