"""Every policy on every trace, in the offline simulator, against each trace's clairvoyant bound.

    .venv/bin/python bench/policies.py [--traces NAME ...] [--policies NAME ...] [--seed N] [--datasets-dir DIR]

Traces: the shared datasets (folders in --datasets-dir) and the generated shapes (`gen-mixed`,
`gen-timer`, ...: simulator/shapes.py, from --seed). dataSet_3 takes about a minute per policy;
`--traces gen-mixed gen-burst --policies learned public-adaptive` runs only those.
Prints a Markdown table: trace x policy -> success rate, cold starts, schedule s, slot GB·s, the
two sub-scores, the score (0 below 99.95 % success), and the wall time of the simulation. The
bound row is what a scaler that knew the trace could reach (simulator/bound.py): no waiting,
minimal idle slot time.
"""

import argparse
import sys
import time
from pathlib import Path

from controller.core.policy import POLICIES, get_policy
from simulator import shapes
from simulator.bound import clairvoyant_bound
from simulator.dataset import Dataset, DatasetError, load_dataset
from simulator.offline import simulate

DATASETS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DATASETS = ["function_smoke_test", "dataSet_1", "dataSet_3"]
GENERATED = [f"gen-{trace}" for trace in shapes.TRACES]
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


def rows(dataset: Dataset, policies: list[str]):
    for name in policies:
        started = time.perf_counter()
        s = simulate(dataset, get_policy(name)).stats()
        took = time.perf_counter() - started
        yield row(
            dataset.name,
            name,
            s.success_rate,
            s.cold_starts,
            s.invocation_schedule_time_in_secs,
            s.total_slot_time_in_g_bs,
            s.resource_usage_score,
            s.cold_start_score,
            s.score,
            took,
        )
    started = time.perf_counter()
    b = clairvoyant_bound(dataset)
    took = time.perf_counter() - started
    yield row(dataset.name, "clairvoyant bound", 1.0, 0, 0.0, b.slot_gb_s, b.resource_usage_score, 50.0, b.score, took)


def load(name: str, datasets_dir: Path, seed: int) -> Dataset:
    if name in GENERATED:
        return shapes.generate(name.removeprefix("gen-"), seed)
    return load_dataset(datasets_dir / name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", default=DATASETS + GENERATED, metavar="NAME")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES), metavar="NAME")
    p.add_argument("--seed", type=int, default=0, help="of the generated traces (default 0)")
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR, metavar="DIR")
    args = p.parse_args()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" if c in ("trace", "policy") else "---:" for c in COLUMNS) + "|")
    for name in args.traces:
        try:
            dataset = load(name, args.datasets_dir, args.seed)
        except DatasetError as e:
            print(f"bench: skipping {name}: {e}", file=sys.stderr)
            continue
        for line in rows(dataset, args.policies):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
