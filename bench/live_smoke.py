"""The smoke test live through `scaler up` at speed 1, and how the scaler's own latency holds in its burst.

    python bench/live_smoke.py [--dataset DIR] [--policy NAME]

Starts `scaler up` (embedded NATS, the node, the workers) pointed at this process's platform, replays
the dataset live as the challenge's simulator would, and prints: failed requests, the score next to
the offline `demo` policy's (the challenge's starter), and the Assign and Idle latencies over the run
and within its busiest second (the smoke test has 806 requests in one second).
"""

import argparse
import asyncio
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.core.policy import DEFAULT_POLICY, get_policy  # noqa: E402
from platform_stub.server import PlatformStub  # noqa: E402
from proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402
from runtime.clock import Clock  # noqa: E402
from runtime.service import run  # noqa: E402
from simulator.dataset import load_dataset  # noqa: E402
from simulator.live import LiveRun  # noqa: E402
from simulator.offline import simulate  # noqa: E402

SMOKE = ROOT.parent / "shared" / "datasets" / "function_smoke_test"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def live(folder: Path, policy: str) -> None:
    dataset = load_dataset(folder)
    clock = Clock(1)
    platform = PlatformStub("127.0.0.1:0", dataset.metas, 100, clock)
    await platform.start()
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler", "up", "--port", "0", "--policy", policy,
        "--platform", f"127.0.0.1:{platform.port}",
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            while not (found := re.search(rb"scaler ready: gRPC \S+:(\d+)", await up.stderr.readline())):
                pass
        async with grpc.aio.insecure_channel(f"127.0.0.1:{found[1].decode()}") as channel:
            driver = LiveRun(dataset, pb_grpc.ScalerStub(channel), platform, clock)
            stats = (await driver.run()).stats()
    finally:
        up.terminate()
        await up.wait()
        await platform.stop()
    offline_demo = simulate(dataset, get_policy("demo")).stats()
    busiest, _ = Counter(c.request.start_time // 1000 for c in driver.calls).most_common(1)[0]
    burst = [c for c in driver.calls if c.request.start_time // 1000 == busiest]
    idle = [c.idle_end - c.idle_start for c in driver.calls if c.idle_end]
    idle_burst = [c.idle_end - c.idle_start for c in burst if c.idle_end]
    assign = [c.assign_end - c.assign_start for c in driver.calls if c.assign_end]
    print(f"{dataset.name} live at speed 1, policy {policy}: {stats.total_requests_count} requests")
    print("| measure | result |\n|---|---|")
    print(f"| failed requests | {stats.failed_requests_count} (success {stats.success_rate:.2%}) |")
    print(f"| score (resource + cold start) | {stats.score:.2f} ({stats.resource_usage_score:.2f} + "
          f"{stats.cold_start_score:.2f}) |")  # fmt: skip
    print(f"| offline `demo` policy's score | {offline_demo.score:.2f} |")
    print(f"| Idle p50 / p99, whole run | {statistics.median(idle):.1f} / {pct(idle, 0.99):.1f} ms |")
    print(f"| Idle p50 / p99, busiest second ({len(burst)} requests) | {statistics.median(idle_burst):.1f} / "
          f"{pct(idle_burst, 0.99):.1f} ms |")  # fmt: skip
    print(f"| Assign p50, whole run (cold starts included) | {statistics.median(assign):.1f} ms |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(SMOKE), help="a dataset folder (default: the smoke test)")
    p.add_argument("--policy", default=DEFAULT_POLICY)
    args = p.parse_args()
    run(live(Path(args.dataset), args.policy))


if __name__ == "__main__":
    main()
