"""`scaler sweep DATASET --policy P [--policy Q] --vary KNOB=a,b,c ...`: a policy's trade-off as a curve.

Each point (a policy with its knobs set) is simulated offline in its own process, as many at once as
there are cores (`--jobs`); the points go into a runs store (`--db`, SQLite: docs/simulation.md), and
from there into a table and a page (`--page`): each policy's cold-start rate against its wasted memory
time as its knob moves, the challenge's score on each point, and the Pareto front of them all marked.
`--compare` adds the seven peers and ours at their defaults. A knob is a numeric field of the policy's
config (`demo`'s and `fixed10`'s `keep_alive_ms`, `learned`'s `exchange_rate`; `--knobs` lists them with their
descriptions); `--vary NAME=...` sets it on every given policy that has it, `--vary POLICY.NAME=...` on
that one only. With several knobs a policy runs every combination.
"""

import argparse
import asyncio
import datetime
import itertools
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from scaler.controller import policies as outside
from scaler.controller.core.policy import DEFAULT_POLICY, POLICIES
from scaler.controller.knobs import KnobError, knobs, listing, with_knobs
from scaler.controller.policies import get_policy
from scaler.simulator import runs
from scaler.simulator.cli import CREATE_LATENCY_MS
from scaler.simulator.dataset import Dataset, DatasetError, load_dataset
from scaler.simulator.offline import Simulation
from scaler.simulator.score import FunctionRow, Stats, worst_functions

DEFAULT_DB = "runs.sqlite"
DEFAULT_PAGE = "sweep.html"
T = TypeVar("T")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Point:
    """A policy with some of its knobs set (as given: `10min`), one run of the sweep."""

    policy: str
    settings: tuple[tuple[str, str], ...] = ()
    compared: bool = False  # there for --compare: a policy at its defaults

    @property
    def label(self) -> str:
        return " ".join([self.policy, *(f"{k}={v}" for k, v in self.settings)])


@dataclass
class Result:
    point: Point
    stats: Stats
    functions: list[FunctionRow]
    knobs: dict[str, int | float]
    took_s: float
    pid: int  # the process that ran it
    pareto: bool = False
    run_id: int = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dataset", nargs="?", metavar="DATASET_DIR", help="a folder with `metas` and `requests` (JSON lines)"
    )
    p.add_argument(
        "--policy",
        action="append",
        type=outside.checked,
        metavar="NAME",
        help=f"a policy to sweep (again for several; {outside.choices()})",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="[POLICY.]KNOB=A,B,C",
        help="the values a knob takes (e.g. keep_alive_ms=5min,10min,20min); again for more knobs",
    )
    p.add_argument(
        "--knobs", action="store_true", help="list the knobs of the policies given (or of all), with defaults, and stop"
    )
    p.add_argument("--compare", action="store_true", help="also every policy at its defaults: the peers and ours")
    p.add_argument("--jobs", type=int, default=CORES, help="points simulated at once, each in a process")
    p.add_argument("--db", default=DEFAULT_DB, metavar="FILE.sqlite", help="the runs store the points go into")
    p.add_argument("--page", default=DEFAULT_PAGE, metavar="PATH.html", help="the page drawn from them")


def points(policies: list[str], vary: list[str]) -> list[Point]:
    """Every combination of each policy's varied knobs; a policy none of them fits runs at its defaults.
    Unknown knobs and bad values are refused (KnobError) before anything runs."""
    wanted: list[tuple[str | None, str, list[str]]] = []
    for text in vary:
        name, eq, values = text.partition("=")
        if not eq or not name or not values:
            raise KnobError(f"--vary {text}: expected KNOB=A,B,C or POLICY.KNOB=A,B,C")
        owner, dot, knob = name.rpartition(".")
        if dot and owner not in policies:
            raise KnobError(f"--vary {text}: {owner!r} is not one of the policies swept ({', '.join(policies)})")
        wanted.append((owner or None, knob, [v for v in values.split(",") if v.strip()]))
    have = {policy: knobs(get_policy(policy)) for policy in policies}
    for owner, knob, _ in wanted:
        if owner is not None:
            with_knobs(get_policy(owner), {knob: "0"})  # refuses a knob the policy lacks, naming its knobs
        elif not any(knob in have[p] for p in policies):
            said = "; ".join(f"{p}: {', '.join(sorted(have[p])) or 'none'}" for p in policies)
            raise KnobError(f"no policy swept has a knob {knob!r} (their knobs: {said})")
    out, seen = [], set()
    for policy in policies:
        mine = [(k, vs) for owner, k, vs in wanted if owner == policy or (owner is None and k in have[policy])]
        for combination in itertools.product(*([(k, v) for v in vs] for k, vs in mine)):
            _, values = with_knobs(get_policy(policy), dict(combination))  # refuses a bad value now, not in a worker
            if (policy, tuple(values.items())) not in seen:  # a value given twice (1min, 60s) is one point
                seen.add((policy, tuple(values.items())))
                out.append(Point(policy, tuple(combination)))
    return out


def compared(todo: list[Point]) -> list[Point]:
    """`--compare`'s points: every policy at its defaults, a swept one too (its default beside its curve) unless
    it is swept at them already."""
    at_defaults = {point.policy for point in todo if not point.settings}
    return [Point(p, compared=True) for p in POLICIES if p not in at_defaults]


_dataset: Dataset | None = None  # each worker's, loaded once


def _load(path: str) -> None:
    global _dataset
    _dataset = load_dataset(path)


def simulate_point(point: Point) -> Result:
    """One point, in a worker (the dataset loaded by `_load`)."""
    assert _dataset is not None
    started = time.perf_counter()
    policy, values = with_knobs(get_policy(point.policy), dict(point.settings))
    run = Simulation(_dataset, policy, CREATE_LATENCY_MS).run()
    stats = run.stats()
    functions = worst_functions(run.invocations, run.slot_gb_s_by_key, stats, len(_dataset.metas))
    return Result(point, stats, functions, values, time.perf_counter() - started, os.getpid())


def sweep(path: str, todo: list[Point], jobs: int, progress=None) -> list[Result]:
    """Simulate every point, `jobs` processes at once; results in the order of `todo`. The workers are forked from a
    fresh server process, not from this one: a child forked from a process whose other threads (the executor's own,
    a test runner's) hold a lock at that moment can hang for ever."""
    done: dict[Point, Result] = {}
    workers, fresh = max(1, min(jobs, len(todo))), multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(workers, mp_context=fresh, initializer=_load, initargs=(path,)) as pool:
        futures = {pool.submit(simulate_point, point): point for point in todo}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            if progress is not None:
                progress(len(done), len(todo), futures[future])
    return [done[point] for point in todo]


def front(points: list[tuple[float, float]]) -> list[bool]:
    """Which points are on the Pareto front: no other point is as low on both coordinates and lower on one."""
    return [not any(o != mine and o[0] <= mine[0] and o[1] <= mine[1] for o in points) for mine in points]


class Reach(NamedTuple):
    """Whether a policy's curve reaches another point: the curve's point at least as good on both (cold-start rate
    and wasted memory time; of several, the one wasting least), or None and where the curve falls short."""

    by: int | None
    short: str = ""


def reach(curve: list[tuple[float, float]], point: tuple[float, float]) -> Reach:
    """Whether some point of `curve` (cold-start rate, wasted GB·s) is at least as good as `point` on both."""
    cold, wasted = point
    better = [j for j, (c, w) in enumerate(curve) if c <= cold and w <= wasted]
    if better:
        return Reach(min(better, key=lambda j: curve[j][1]))
    as_few = [w for c, w in curve if c <= cold]
    if not as_few:
        return Reach(None, f"its fewest cold starts are {min(c for c, _ in curve):.2%} of the invocations")
    return Reach(None, f"at {cold:.2%} cold starts or fewer it wastes {min(as_few):,.0f} GB·s or more")


def curves(points: list[T], policy_of: Callable[[T], str]) -> Iterator[tuple[str, list[T], list[T]]]:
    """Each policy swept over several points (a curve): its name, its points and every other policy's."""
    for policy in dict.fromkeys(map(policy_of, points)):
        mine = [x for x in points if policy_of(x) == policy]
        if len(mine) > 1:
            yield policy, mine, [x for x in points if policy_of(x) != policy]


def reaches(results: list[Result]) -> list[str]:
    """Whether each policy swept over several points (a curve) reaches each other policy's point, a line each."""
    lines = []
    for policy, mine, others in curves(results, lambda r: r.point.policy):
        curve = [(r.stats.cold_start_rate, r.stats.wasted_memory_time_in_g_bs) for r in mine]
        for other in others:
            at = (other.stats.cold_start_rate, other.stats.wasted_memory_time_in_g_bs)
            found = reach(curve, at)
            theirs = f"{at[0]:.2%} and {at[1]:,.0f} GB·s"
            if found.by is None:
                lines.append(f"{policy} does not reach {other.point.label} ({theirs}): {found.short}")
            else:
                ours = f"{mine[found.by].point.label} ({curve[found.by][0]:.2%} and {curve[found.by][1]:,.0f})"
                lines.append(f"{policy} reaches {other.point.label} ({theirs}) at {ours}")
    return lines


def pareto(results: list[Result]) -> None:
    """Mark the points no other point beats on both cold-start rate and wasted memory time."""
    on = front([(r.stats.cold_start_rate, r.stats.wasted_memory_time_in_g_bs) for r in results])
    for r, yes in zip(results, on, strict=True):
        r.pareto = yes


class Bar:
    """Points done, on stderr: a bar redrawn on a terminal, a line per point in a log."""

    def __init__(self, out=None) -> None:
        self.out, self.began = out or sys.stderr, time.monotonic()

    def __call__(self, done: int, total: int, point: Point) -> None:
        elapsed = time.monotonic() - self.began
        if self.out.isatty():
            filled = 30 * done // total
            self.out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} points, {elapsed:.0f}s\x1b[K")
            self.out.write("\n" if done == total else "")
        else:
            self.out.write(f"sweep: {done}/{total} points, {elapsed:.0f}s: {point.label} done\n")
        self.out.flush()


def table(results: list[Result]) -> list[str]:
    head = ("point", "cold-start rate", "wasted GB·s", "wait p99 ms", "slot GB·s", "score", "Pareto")
    rows = [
        (
            r.point.label + (" (defaults)" if r.point.compared else ""),
            f"{r.stats.cold_start_rate:.2%}",
            f"{r.stats.wasted_memory_time_in_g_bs:,.0f}",
            f"{r.stats.wait_p99_in_ms:,.0f}",
            f"{r.stats.total_slot_time_in_g_bs:,.0f}",
            f"{r.stats.score:.2f}",
            "*" if r.pareto else "",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(cells: tuple[str, ...]) -> str:
        first, *rest = zip(cells, widths, strict=True)
        return "  ".join([first[0].ljust(first[1]), *(c.rjust(w) for c, w in rest)])

    return [line(head), *(line(row) for row in rows)]


def run(args: argparse.Namespace) -> int:
    if args.knobs:
        print("\n".join(listing(get_policy(p)) for p in dict.fromkeys(args.policy or POLICIES)))
        return 0
    if not args.dataset:
        print("scaler sweep: error: a DATASET_DIR to sweep (or --knobs)", file=sys.stderr)
        return 1
    try:
        dataset = load_dataset(args.dataset)  # checked here, before any worker starts
        policies = list(dict.fromkeys(args.policy or [DEFAULT_POLICY]))
        todo = points(policies, args.vary)
        if args.compare:
            todo += compared(todo)
        if args.jobs < 1:
            raise KnobError("--jobs must be 1 or more")
        print(f"sweep: {len(todo)} points of {dataset.name}, {min(args.jobs, len(todo))} at once", file=sys.stderr)
        results = sweep(args.dataset, todo, args.jobs, Bar())
        pareto(results)
        sweep_id = f"{dataset.name} {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}"
        ids = asyncio.run(runs.record(Path(args.db), [_record(dataset.name, sweep_id, r) for r in results]))
        for r, run_id in zip(results, ids, strict=True):
            r.run_id = run_id
        from scaler.report import draw  # plotly is slow to import: only once there is a page to draw
        from scaler.simulator.sweep_page import page

        draw.write(Path(args.page), asyncio.run(page(Path(args.db), sweep_id)))
    except (DatasetError, KnobError, runs.RunsError) as e:
        print(f"scaler sweep: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"scaler sweep: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scaler sweep: interrupted", file=sys.stderr)
        return 130
    print("\n".join(table(results)))
    if lines := reaches(results):
        print("\n" + "\n".join(lines))
    processes = len({r.pid for r in results})
    print(f"\n{len(results)} points in {processes} processes; kept in {args.db} (sweep {sweep_id!r}); page {args.page}")
    return 0


def _record(trace: str, sweep_id: str, r: Result) -> runs.Record:
    title = f"{trace}: offline, {r.point.label}"
    return runs.Record(trace, r.point.policy, r.stats, r.functions, r.knobs, title=title, sweep=sweep_id)
