"""Huawei Cloud 2023 ("How Does It Function?", SoCC'23) and the cold starts of Huawei Cloud 2025
("Serverless Cold Starts and Where to Find Them", EuroSys'25), as published in sir-lab/data-release.

2023: SRC is `private_dataset` or `public_dataset`, folders of one CSV per day (`day_000.csv`, ...)
with columns `day`, `time` (seconds from the dataset's start) and one column per function id. One day
is converted: its requests from `requests_second` (private) or `requests_minute`, each request's
execution time from `function_delay_second`/`_minute` of the same second or minute, and the memory of
a pod from `memory_limit_minute` over `instances_minute`. The public set has requests only.

2025: the cold-start table (`day,time,...,totalCost_cold_start,...,podID`) gives start times (and the
pods' memory, from the pool in `podID`) to draw inits from: `--init-from huawei2025:PATH`
(scaler/traces/inits.py). docs/traces.md says why only that part of it is used.
"""

import re
import statistics
from pathlib import Path

from scaler.traces.build import Function, TraceError, spread
from scaler.traces.csvfile import Table, number, table

DAY_S = 86_400
BASE_MS = 1_672_531_200_000  # an arbitrary day 0 (2023-01-01 00:00 UTC): the trace's times start at 0
POOL = re.compile(r"pool\d+-(\d+)-(\d+)")  # pool22-300-128: 300 millicores, 128 MB


def day_files(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    found = (re.fullmatch(r"day_(\d+)\.csv", p.name) for p in folder.iterdir())
    return {int(m.group(1)): folder / m.group(0) for m in found if m}


def series(path: Path | None, every_s: int) -> tuple[Table | None, dict[str, dict[int, float]]]:
    """A day's file as function id -> (ms from the day's start -> value), the empty cells left out."""
    if path is None:
        return None, {}
    t = table(path, "day", "time")
    day, time = t.column("day"), t.column("time")
    ids = [(c, name) for c, name in enumerate(t.header) if c not in (day, time)]
    found: dict[str, dict[int, float]] = {name: {} for _, name in ids}
    for line, row in t.rows():
        at = round(number(t, line, row[time], "time") - number(t, line, row[day], "day") * DAY_S)
        if not 0 <= at < DAY_S:
            raise TraceError(f"{path}:{line}: time {row[time]} is not on day {row[day]}")
        for c, name in ids:
            if row[c].strip() and row[c].strip().lower() != "nan":
                found[name][at * 1000 // (every_s * 1000) * every_s * 1000] = number(t, line, row[c], name)
    return t, found


def read(
    src: Path, day: int | None, window: tuple[int, int] | None, default_duration_ms: int
) -> tuple[list[Function], int, str]:
    """The day's functions, the epoch ms the window starts at, and which files were used, said in words."""
    if not src.is_dir():
        raise TraceError(f"{src}: not a folder of the Huawei 2023 trace (private_dataset or public_dataset)")
    every_s, requests_dir = (1, "requests_second") if day_files(src / "requests_second") else (60, "requests_minute")
    files = day_files(src / requests_dir)
    if not files:
        raise TraceError(f"{src}: neither requests_second/ nor requests_minute/ holds day_NNN.csv files")
    day = min(files) if day is None else day
    if day not in files:
        raise TraceError(f"{src / requests_dir}: no file for day {day} (days {min(files)}-{max(files)})")
    unit = "second" if every_s == 1 else "minute"
    delay_path = day_files(src / f"function_delay_{unit}").get(day)
    _, counts = series(files[day], every_s)
    _, delays = series(delay_path, every_s)
    memory = pod_memory(day_files(src / "memory_limit_minute").get(day), day_files(src / "instances_minute").get(day))
    lo, hi = window or (0, DAY_S * 1000)
    functions = []
    for name, by_time in counts.items():
        arrivals = [(at - lo, round(n)) for at, n in sorted(by_time.items()) if lo <= at < hi and n >= 1]
        delay = delays.get(name, {})
        typical = statistics.median(delay.values()) if delay else default_duration_ms
        functions.append(_function(name, arrivals, every_s * 1000, delay, lo, typical, memory.get(name)))
    used = f"day {day}: {requests_dir}" + (f", function_delay_{unit}" if delay_path else "")
    used += ", memory_limit_minute / instances_minute" if memory else ""
    return functions, BASE_MS + day * DAY_S * 1000 + lo, used


def pod_memory(limits: Path | None, instances: Path | None) -> dict[str, int]:
    """Each function's memory per pod: its allocated memory over its pods, the median over the day's minutes
    that have both (the limit alone when there is no instance count)."""
    _, limit = series(limits, 60)
    _, pods = series(instances, 60)
    found = {}
    for name, by_time in limit.items():
        count = pods.get(name, {})
        per_pod = [
            mb / count[at] if count else mb for at, mb in by_time.items() if mb > 0 and (count.get(at) or not count)
        ]
        if per_pod:
            found[name] = round(statistics.median(per_pod))
    return found


def _function(
    name: str, arrivals: list[tuple[int, int]], interval_ms: int, delay: dict[int, float], lo: int, typical: float,
    memory: int | None,
) -> Function:  # fmt: skip
    def requests(rng) -> list[tuple[int, int]]:
        calls = []
        for start, n in arrivals:
            ms = max(round(delay.get(start + lo, typical)), 0)
            calls += [(t, ms) for t in spread([(start, n)], interval_ms, rng)]
        return calls

    return Function(name, sum(n for _, n in arrivals), requests, memory_mb=memory)


def cold_starts(path: Path) -> list[tuple[int, int | None]]:
    """The 2025 cold-start table's starts, (totalCost_cold_start in ms, the memory of the pod's pool): one
    region's file, or the folder of its day files (R2/*.csv) as the release unpacks."""
    files = sorted(p for p in path.iterdir() if p.suffix == ".csv") if path.is_dir() else [path]
    found = []
    for one in files:
        t = table(one, "totalCost_cold_start", "podID")
        cost, pod = t.column("totalCost_cold_start"), t.column("podID")
        for line, row in t.rows():
            pool = POOL.match(row[pod].strip())
            found.append((round(number(t, line, row[cost], "totalCost_cold_start") * 1000), _mb(pool)))
    if not found:
        raise TraceError(f"{path}: no cold starts (totalCost_cold_start, podID)")
    return found


def _mb(pool: re.Match | None) -> int | None:
    return int(pool.group(2)) if pool else None
