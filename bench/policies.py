"""Every policy on every trace, in the offline simulator, against each trace's clairvoyant bound.

    .venv/bin/python bench/policies.py [--traces NAME ...] [--policies NAME ...] [--seeds N ...] [--jobs N]
    .venv/bin/python bench/policies.py --summarize TABLE.md ...

Traces: the shared datasets (folders in --datasets-dir) and the generated shapes (`gen-mixed`,
`gen-timer`, ...: scaler/simulator/shapes.py), each for every seed of --seeds (0-5 by default), named
`gen-burst/3` for seed 3. dataSet_3 takes one to three minutes per policy; `--traces gen-mixed
gen-burst --policies learned cidre --seeds 0` runs only those. `--jobs N` simulates N at once, in
processes (for an idle machine).

Prints a Markdown table: trace x policy -> success rate, cold starts, schedule s, slot GB·s, the
two sub-scores, the score (0 below 99.95 % success), and the wall time of the simulation. The
bound row is what a scaler that knew the trace could reach (scaler/simulator/bound.py): no waiting,
minimal idle slot time. Then a summary: each trace's score per policy beside its bound, `learned`'s
margin over the best peer, and each generated shape's mean over the seeds. `--summarize` prints that
summary from tables printed before (several runs' rows, concatenated, make one).
"""

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from scaler.controller.core.policy import DEFAULT_POLICY, POLICIES, get_policy
from scaler.simulator import shapes
from scaler.simulator.bound import clairvoyant_bound
from scaler.simulator.dataset import Dataset, DatasetError, load_dataset
from scaler.simulator.offline import simulate

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
    "wall s",
)


def row(trace: str, policy: str, success: float, cold: int, schedule_s: float, slot: float, *scores: float) -> str:
    resource, cold_score, score, took = scores
    cells = (trace, policy, f"{100 * success:.2f}", f"{cold:,}", f"{schedule_s:,.1f}", f"{slot:,.0f}")
    return "| " + " | ".join((*cells, f"{resource:.2f}", f"{cold_score:.2f}", f"{score:.2f}", f"{took:.1f}")) + " |"


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
        return row(trace, BOUND, 1.0, 0, 0.0, b.slot_gb_s, b.resource_usage_score, 50.0, b.score, took)
    s = simulate(dataset, get_policy(policy)).stats()
    took = time.perf_counter() - started
    return row(
        trace,
        policy,
        s.success_rate,
        s.cold_starts,
        s.invocation_schedule_time_in_secs,
        s.total_slot_time_in_g_bs,
        s.resource_usage_score,
        s.cold_start_score,
        s.score,
        took,
    )


def summary(lines: Iterable[str]) -> list[str]:
    """Score per trace and policy beside the bound; `learned`'s margin over the best peer; per generated
    shape, the mean over its seeds."""
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS) or cells[0] in ("trace", "---") or cells[0].startswith("-"):
            continue
        scores[cells[0]][cells[1]] = float(cells[-2])
    policies = [p for p in POLICIES if any(p in by for by in scores.values())]
    peers = [p for p in policies if p != DEFAULT_POLICY]
    means: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trace, by in scores.items():
        if "/" in trace:
            for policy, score in by.items():
                means[trace.split("/")[0]][policy].append(score)
    table = dict(scores)
    for shape, by in means.items():
        if len({len(v) for v in by.values()}) == 1 and len(next(iter(by.values()))) > 1:
            table[f"{shape} mean of {len(next(iter(by.values())))}"] = {p: sum(v) / len(v) for p, v in by.items()}
    head = ["trace", *policies, "bound", f"{DEFAULT_POLICY} - best peer"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for trace, by in table.items():
        cells = [f"{by[p]:.2f}" if p in by else "" for p in policies]
        margin = ""
        if DEFAULT_POLICY in by and any(p in by for p in peers):
            best = max((p for p in peers if p in by), key=lambda p: by[p])
            margin = f"{by[DEFAULT_POLICY] - by[best]:+.2f} ({best})"
        bound = f"{by[BOUND]:.2f}" if BOUND in by else ""
        out.append("| " + " | ".join([trace, *cells, bound, margin]) + " |")
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
