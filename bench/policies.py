"""Every policy on every dataset, in the offline simulator, against each dataset's clairvoyant bound.

    .venv/bin/python bench/policies.py [--datasets NAME ...] [--policies NAME ...] [--datasets-dir DIR]

Prints a Markdown table: dataset x policy -> cold starts, schedule s, slot GB·s, the two
sub-scores, the score, and the wall time of the simulation. The bound row is what a scaler that
knew the trace could reach (simulator/bound.py): no waiting, minimal idle slot time.
"""

import argparse
import sys
import time
from pathlib import Path

from controller.core.policy import POLICIES, get_policy
from simulator.bound import clairvoyant_bound
from simulator.dataset import DatasetError, load_dataset
from simulator.offline import simulate

DATASETS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DATASETS = ["function_smoke_test", "dataSet_1", "dataSet_3"]
COLUMNS = ("dataset", "policy", "cold starts", "schedule s", "slot GB·s", "resource", "cold-start", "score", "wall s")


def row(
    dataset: str,
    policy: str,
    cold: int,
    schedule_s: float,
    slot: float,
    resource: float,
    cold_score: float,
    score: float,
    took: float,
) -> str:
    cells = (dataset, policy, f"{cold:,}", f"{schedule_s:,.1f}", f"{slot:,.0f}", f"{resource:.2f}", f"{cold_score:.2f}")
    return "| " + " | ".join((*cells, f"{score:.2f}", f"{took:.1f}")) + " |"


def rows(folder: Path, policies: list[str]):
    dataset = load_dataset(folder)
    for name in policies:
        started = time.perf_counter()
        s = simulate(dataset, get_policy(name)).stats()
        took = time.perf_counter() - started
        yield row(
            dataset.name,
            name,
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
    yield row(dataset.name, "clairvoyant bound", 0, 0.0, b.slot_gb_s, b.resource_usage_score, 50.0, b.score, took)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=DATASETS, metavar="NAME")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES), metavar="NAME")
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR, metavar="DIR")
    args = p.parse_args()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" if c in ("dataset", "policy") else "---:" for c in COLUMNS) + "|")
    for name in args.datasets:
        try:
            for line in rows(args.datasets_dir / name, args.policies):
                print(line, flush=True)
        except DatasetError as e:
            print(f"bench: skipping {name}: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
