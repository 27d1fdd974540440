"""Several nodes: what splitting the run-wide figures costs the policy, and throughput with 1, 2 and 4 nodes.

    python bench/nodes.py [--nodes 1 2 4] [--seconds S] [--traces NAME ...] [--datasets-dir DIR]

1. The learned policy values waiting at an exchange rate taken from the run's totals. A node only
   sees the totals of the partitions it holds, so with N nodes each decides with its share. The
   offline simulator runs each trace with the totals split as N nodes would hold them: the score
   with 1 and with 4 nodes side by side.
2. Live, on this machine: `scaler up` (embedded NATS, the platform stub, the workers, one node, demo
   policy) plus N-1 more `scaler node` processes on its NATS, the partitions shared by leases; a
   client in its own process spreads 50 callers over 50 functions and over the nodes (each caller
   calls one node; a call for a partition another node holds is forwarded there). Prints Assign +
   Idle pairs per second and Assign latency at that load.
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.hot_path import client, spawn, stop  # noqa: E402
from bench.policies import load  # noqa: E402  (shared datasets and generated shapes, by name)
from scaler.controller.core.policy import get_policy  # noqa: E402
from scaler.controller.leases import holders  # noqa: E402
from scaler.proto.subjects import PARTITIONS  # noqa: E402
from scaler.runtime.bus import connected  # noqa: E402
from scaler.runtime.service import run  # noqa: E402
from scaler.simulator.offline import Simulation  # noqa: E402

DATASETS_DIR = ROOT.parent / "shared" / "datasets"


def offline_split(traces: list[str], datasets_dir: Path) -> list[str]:
    lines = [
        "| trace | learned, 1 node | 4 nodes, totals split | 4 nodes, totals shared every second |",
        "|---|---:|---:|---:|",
    ]
    for name in traces:
        dataset = load(name, datasets_dir, seed=0)
        one, split, shared = (
            Simulation(dataset, get_policy("learned"), nodes=n, share_every_ms=every).run().stats().score
            for n, every in ((1, 0), (4, 0), (4, 1000))
        )
        lines.append(f"| {name} | {one:.2f} | {split:.2f} ({split - one:+.2f}) | {shared:.2f} ({shared - one:+.2f}) |")
    return lines


async def shared_by(nats_url: str, nodes: int) -> None:
    async with connected(nats_url, "bench") as nc, asyncio.timeout(30):
        while True:
            held = list((await holders(nc.jetstream())).values())
            counts = [held.count(n) for n in set(held)]
            if len(counts) == nodes and sum(counts) == PARTITIONS and max(counts) - min(counts) <= 1:
                return
            await asyncio.sleep(0.2)


async def live(nodes: int, seconds: float) -> dict:
    up, found = await spawn(
        sys.executable, "-m", "scaler", "up", "--port", "0", "--policy", "demo",
        ready=r"scaler ready: gRPC \S+:(\d+), .* nats (nats://\S+)",
    )  # fmt: skip
    more = []
    try:
        addresses = [f"127.0.0.1:{found[1]}"]
        for _ in range(nodes - 1):
            proc, at = await spawn(
                sys.executable, "-m", "scaler", "node", "--nats", found[2], "--listen", "127.0.0.1:0",
                "--policy", "demo", "--log-level", "INFO", ready=r"ready: .*gateway on (\S+)",
            )  # fmt: skip
            more.append(proc)
            addresses.append(at[1])
        began = time.perf_counter()
        await shared_by(found[2], nodes)
        settled_s = time.perf_counter() - began
        result = await client(",".join(addresses), 200, seconds)
        return {**result, "settled_s": settled_s}
    finally:
        for proc in [*more, up]:
            await stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--traces", nargs="+", default=["dataSet_1", "dataSet_3", "gen-mixed"])
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR)
    args = p.parse_args()
    print("\n".join(offline_split(args.traces, args.datasets_dir)))
    print()
    print(
        "| nodes | leases shared after | pairs/s, 50 callers | Assign p99 at that load | warm Assign p50, one caller |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in args.nodes:
        r = run(live(n, args.seconds))
        print(f"| {n} | {r['settled_s']:.1f} s | {r['pairs_per_s']:,.0f} | {r['p99_ms_at_load']:.1f} ms "
              f"| {r['p50_ms']:.2f} ms |")  # fmt: skip


if __name__ == "__main__":
    main()
