"""Azure Functions 2019 ("Serverless in the Wild", ATC'20): one day's per-minute invocation counts, with
each function's execution-time percentiles and its application's memory percentiles.

Files (in SRC, a folder): `invocations_per_function_md.anon.dNN.csv`, `function_durations_percentiles
.anon.dNN.csv` and, for days 01-12, `app_memory_percentiles.anon.dNN.csv`; columns as published in
AzureFunctionsDataset2019.md. The conversion's assumptions are in docs/traces.md.
"""

import re
from pathlib import Path

from scaler.traces.build import MINUTE_MS, Function, Percentiles, TraceError, spread
from scaler.traces.csvfile import number, table

INVOCATIONS = "invocations_per_function_md.anon.d{day:02}.csv"
DURATIONS = "function_durations_percentiles.anon.d{day:02}.csv"
MEMORY = "app_memory_percentiles.anon.d{day:02}.csv"
MINUTES = 1440
DURATION_PERCENTILES = (0, 1, 25, 50, 75, 99, 100)  # percentile_Average_{q}
MEMORY_PERCENTILES = (1, 5, 25, 50, 75, 95, 99, 100)  # AverageAllocatedMb_pct{q} (the 0th was not logged)
BASE_MS = 1_563_148_800_000  # 2019-07-15 00:00 UTC: day 1 (the trace says only "July 2019")


def days(src: Path) -> list[int]:
    found = [re.fullmatch(r"invocations_per_function_md\.anon\.d(\d\d)\.csv", p.name) for p in src.iterdir()]
    return sorted(int(m.group(1)) for m in found if m)


def key(app: str, function: str) -> str:
    """16 hex digits of the app and of the function: readable, and unique in practice (checked)."""
    return f"{app[:16]}-{function[:16]}"


def durations(path: Path) -> dict[tuple[str, str], Percentiles]:
    t = table(path, "HashApp", "HashFunction", *(f"percentile_Average_{q}" for q in DURATION_PERCENTILES))
    app, fn = t.column("HashApp"), t.column("HashFunction")
    cols = [(q, t.column(f"percentile_Average_{q}")) for q in DURATION_PERCENTILES]
    found = {}
    for line, row in t.rows():
        points = tuple((q, number(t, line, row[c], f"percentile_Average_{q}")) for q, c in cols)
        found[(row[app], row[fn])] = Percentiles(points)
    return found


def memory(path: Path) -> dict[str, Percentiles]:
    if not path.exists():
        return {}  # days 13 and 14 have none
    t = table(path, "HashApp", *(f"AverageAllocatedMb_pct{q}" for q in MEMORY_PERCENTILES))
    app = t.column("HashApp")
    cols = [(q, t.column(f"AverageAllocatedMb_pct{q}")) for q in MEMORY_PERCENTILES]
    found = {}
    for line, row in t.rows():
        points = tuple((q, number(t, line, row[c], f"AverageAllocatedMb_pct{q}")) for q, c in cols)
        if points[-1][1] > 0:
            found[row[app]] = Percentiles(points)
    return found


def read(src: Path, day: int | None, window: tuple[int, int] | None) -> tuple[list[Function], int, dict[str, int]]:
    """The day's functions (the first day in SRC by default), the epoch ms the day starts at, and what was
    left out (functions with no duration percentiles)."""
    if not src.is_dir():
        raise TraceError(f"{src}: not a folder of the Azure Functions 2019 trace")
    present = days(src)
    if not present:
        raise TraceError(f"{src}: no {INVOCATIONS.format(day=1).replace('01', 'NN')}")
    day = present[0] if day is None else day
    if day not in present:
        raise TraceError(f"{src}: no {INVOCATIONS.format(day=day)} (days present: {', '.join(map(str, present))})")
    by_function = durations(src / DURATIONS.format(day=day))
    by_app = memory(src / MEMORY.format(day=day))
    t = table(src / INVOCATIONS.format(day=day), "HashOwner", "HashApp", "HashFunction", "Trigger", "1", "1440")
    app, fn = t.column("HashApp"), t.column("HashFunction")
    first = t.column("1")
    lo, hi = window or (0, MINUTES * MINUTE_MS)
    functions, keys, left_out = [], {}, {"without duration percentiles": 0}
    for line, row in t.rows():
        run = by_function.get((row[app], row[fn]))
        if run is None:
            left_out["without duration percentiles"] += 1
            continue
        counts = [
            (m * MINUTE_MS, int(number(t, line, row[first + m], str(m + 1))))
            for m in range(MINUTES)
            if lo <= m * MINUTE_MS < hi
        ]
        counts = [(start - lo, n) for start, n in counts if n > 0]
        k = key(row[app], row[fn])
        if keys.setdefault(k, (row[app], row[fn])) != (row[app], row[fn]):
            raise TraceError(f"{t.path}:{line}: two functions share the key {k}")
        functions.append(_function(k, counts, run, by_app.get(row[app])))
    return functions, BASE_MS + (day - 1) * MINUTES * MINUTE_MS + lo, left_out


def _function(k: str, counts: list[tuple[int, int]], run: Percentiles, memory: Percentiles | None) -> Function:
    def requests(rng) -> list[tuple[int, int]]:
        return [(t, max(round(run.draw(rng)), 0)) for t in spread(counts, MINUTE_MS, rng)]

    return Function(k, sum(n for _, n in counts), requests, memory=memory)
