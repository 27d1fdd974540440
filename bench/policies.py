"""Every policy on every trace, in the offline simulator, against each trace's clairvoyant bound.

    .venv/bin/python bench/policies.py [--traces NAME ...] [--policies NAME ...] [--seeds N ...] [--jobs N]
    .venv/bin/python bench/policies.py --summarize TABLE.md ...

Traces: the shared datasets (folders in --datasets-dir) and the generated shapes (`gen-mixed`,
`gen-timer`, ...: scaler/simulator/shapes.py), each for every seed of --seeds (0-5 by default), named
`gen-burst/3` for seed 3. dataSet_3 takes one to three minutes per policy; `--traces gen-mixed
gen-burst --policies learned cidre --seeds 0` runs only those. `--jobs N` simulates N at once, in
processes (for an idle machine).

Prints a Markdown table: trace x policy -> success rate, cold starts, schedule s, slot GB·s, the
two sub-scores, the score (0 below 99.95 % success), the papers' metrics (cold-start rate, wasted
memory GB·s, wait p50/p99/max: docs/simulation.md) and the wall time of the simulation. The bound
row is what a scaler that knew the trace could reach (scaler/simulator/bound.py): no waiting, minimal
idle slot time. Then a summary: each trace's score per policy beside its bound, `learned`'s margin
over the best peer, and each generated shape's mean over the seeds; and every policy against fixed10
in the papers' terms (the % change of its cold-start rate and of its wasted memory time, a shape's
means over its seeds), the row "learned against fixed10" among them. `--summarize` prints that
summary from tables printed before (several runs' rows, concatenated, make one).
"""

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec

from scaler.controller.core.policy import DEFAULT_POLICY, POLICIES, get_policy
from scaler.simulator import shapes
from scaler.simulator.bound import clairvoyant_bound
from scaler.simulator.dataset import Dataset, DatasetError, load_dataset
from scaler.simulator.offline import simulate
from scaler.simulator.score import Stats, summarize

DATASETS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DATASETS = ["function_smoke_test", "dataSet_1", "dataSet_3"]
GENERATED = [f"gen-{trace}" for trace in shapes.TRACES]
BOUND = "clairvoyant bound"
COLUMNS = (
    "trace",
    "policy",
    "success %",
    "cold starts",
    "schedule s",
    "slot GB·s",
    "resource",
    "cold-start",
    "score",
    "cold-start rate %",
    "wasted GB·s",
    "wait p50 ms",
    "wait p99 ms",
    "wait max ms",
    "wall s",
)
BASELINE = "fixed10"  # what the papers' changes are measured against: a 10-minute keep-alive


def row(trace: str, policy: str, s: Stats, took: float) -> str:
    cells = (
        trace,
        policy,
        f"{100 * s.success_rate:.2f}",
        f"{s.cold_starts:,}",
        f"{s.invocation_schedule_time_in_secs:,.1f}",
        f"{s.total_slot_time_in_g_bs:,.0f}",
        f"{s.resource_usage_score:.2f}",
        f"{s.cold_start_score:.2f}",
        f"{s.score:.2f}",
        f"{100 * s.cold_start_rate:.2f}",
        f"{s.wasted_memory_time_in_g_bs:,.0f}",
        f"{s.wait_p50_in_ms:,.0f}",
        f"{s.wait_p99_in_ms:,.0f}",
        f"{s.wait_max_in_ms:,.0f}",
        f"{took:.1f}",
    )
    return "| " + " | ".join(cells) + " |"


def trace_name(name: str, seed: int) -> str:
    return f"{name}/{seed}" if name in GENERATED else name


def load(name: str, datasets_dir: Path, seed: int) -> Dataset:
    if name in GENERATED:
        return shapes.generate(name.removeprefix("gen-"), seed)
    return load_dataset(datasets_dir / name)


def measure(name: str, seed: int, policy: str, datasets_dir: Path) -> str:
    """One row: `policy` (or the bound) on the trace."""
    dataset = load(name, datasets_dir, seed)
    trace = trace_name(name, seed)
    started = time.perf_counter()
    if policy == BOUND:
        b = clairvoyant_bound(dataset)
        took = time.perf_counter() - started
        n = len(dataset.requests)
        stats = summarize([], b.slot_gb_s, 0)  # no invocation waits; the bound's slot time
        stats = msgspec.structs.replace(
            stats,
            total_requests_count=n,
            success_rate=1.0,
            resource_usage_score=b.resource_usage_score,
            cold_start_score=50.0,
            score=b.score,
            wasted_memory_time_in_g_bs=b.idle_gb_s,
        )
        return row(trace, BOUND, stats, took)
    s = simulate(dataset, get_policy(policy)).stats()
    return row(trace, policy, s, time.perf_counter() - started)


def parse(lines: Iterable[str]) -> dict[str, dict[str, dict[str, float]]]:
    """The rows of tables printed before: trace -> policy -> column -> value (numbers only)."""
    rows: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS) or cells[0] in ("trace", "---") or cells[0].startswith("-"):
            continue
        rows[cells[0]][cells[1]] = {c: float(v.replace(",", "")) for c, v in zip(COLUMNS[2:], cells[2:], strict=True)}
    return rows


def families(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each generated shape's mean over its seeds (`gen-burst mean of 6`), when every policy ran every seed."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for trace, by in rows.items():
        if "/" in trace:
            for policy, cells in by.items():
                runs[trace.split("/")[0]][policy].append(cells)
    means = {}
    for shape, by in runs.items():
        counts = {len(v) for v in by.values()}
        if len(counts) == 1 and (n := counts.pop()) > 1:
            means[f"{shape} mean of {n}"] = {
                policy: {c: sum(r[c] for r in seeds) / n for c in COLUMNS[2:]} for policy, seeds in by.items()
            }
    return means


def summary(lines: Iterable[str]) -> list[str]:
    """Score per trace and policy beside the bound; `learned`'s margin over the best peer; per generated
    shape, the mean over its seeds. Then each policy against fixed10 in the papers' terms."""
    rows = parse(lines)
    table = {**rows, **families(rows)}
    policies = [p for p in POLICIES if any(p in by for by in rows.values())]
    peers = [p for p in policies if p != DEFAULT_POLICY]
    head = ["trace", *policies, "bound", f"{DEFAULT_POLICY} - best peer"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for trace, by in table.items():
        score = {p: cells["score"] for p, cells in by.items()}
        cells = [f"{score[p]:.2f}" if p in score else "" for p in policies]
        margin = ""
        if DEFAULT_POLICY in score and any(p in score for p in peers):
            best = max((p for p in peers if p in score), key=lambda p: score[p])
            margin = f"{score[DEFAULT_POLICY] - score[best]:+.2f} ({best})"
        bound = f"{score[BOUND]:.2f}" if BOUND in score else ""
        out.append("| " + " | ".join([trace, *cells, bound, margin]) + " |")
    return [*out, "", *papers(table, policies)]


def change(new: float, old: float) -> str:
    return f"{100 * (new - old) / old:+.0f} %" if old else ("±0 %" if not new else "new")


def papers(table: dict[str, dict[str, dict[str, float]]], policies: list[str]) -> list[str]:
    """Each policy against fixed10 as the papers put it: the change of its cold-start rate and of its wasted
    memory time (GB·s of instances not running a request), on each trace (a shape's mean over its seeds)."""
    traces = [t for t, by in table.items() if "/" not in t and BASELINE in by]
    if not traces:
        return []
    out = [
        f"Against {BASELINE}, in the papers' terms: cold-start rate change / wasted memory time change",
        "",
        "| | " + " | ".join(traces) + " |",
        "|---|" + "---:|" * len(traces),
    ]
    for policy in [p for p in policies if p != BASELINE]:
        cells = []
        for trace in traces:
            mine, base = table[trace].get(policy), table[trace][BASELINE]
            if mine is None:
                cells.append("")
                continue
            rate = change(mine["cold-start rate %"], base["cold-start rate %"])
            cells.append(f"{rate} / {change(mine['wasted GB·s'], base['wasted GB·s'])}")
        out.append(f"| {policy} against {BASELINE} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", default=DATASETS + GENERATED, metavar="NAME")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES), metavar="NAME")
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(6)), help="of the generated traces (0-5)")
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR, metavar="DIR")
    p.add_argument("--jobs", type=int, default=1, help="simulations at once, each in a process (default 1)")
    p.add_argument("--no-bound", action="store_true", help="leave the bound rows out")
    p.add_argument("--summarize", nargs="+", type=Path, metavar="TABLE", help="only summarize tables printed before")
    args = p.parse_args()
    if args.summarize:
        print("\n".join(summary(line for path in args.summarize for line in path.read_text().splitlines())))
        return 0
    tasks = []
    for name in args.traces:
        for seed in args.seeds if name in GENERATED else [0]:
            if name not in GENERATED and not (args.datasets_dir / name).is_dir():
                print(f"bench: skipping {name}: no folder in {args.datasets_dir}", file=sys.stderr)
                continue
            tasks += [(name, seed, policy) for policy in (*args.policies, *([] if args.no_bound else [BOUND]))]
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if c in ("trace", "policy") else "---:" for c in COLUMNS) + "|",
    ]
    print("\n".join(lines), flush=True)
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        if args.jobs > 1:
            done = (pool.submit(measure, *task, args.datasets_dir) for task in tasks)
            results = [future.result for future in list(done)]
        else:  # in this process, each as its turn comes
            results = [lambda task=task: measure(*task, args.datasets_dir) for task in tasks]
        for result in results:
            try:
                line = result()
            except DatasetError as e:
                print(f"bench: {e}", file=sys.stderr)
                continue
            lines.append(line)
            print(line, flush=True)
    print()
    print("\n".join(summary(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
