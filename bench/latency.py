"""What the scaler itself adds to a call: warm Assign and Idle latency, and calls per second.

Runs `scaler up` as a user does (each part its own process) against an in-process platform stub,
warms one instance per function, then measures warm calls (no CreateSlot, no Init: only the
gateway, NATS and the controller): one function at a time, then many functions at once.
Prints a table; the figures are this machine's, one run.

    python bench/latency.py [--calls 2000] [--functions 50] [--concurrency 50]
"""

import argparse
import asyncio
import re
import statistics
import sys
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from platform_stub.server import PlatformStub  # noqa: E402
from proto import serverless_sim_pb2 as pb  # noqa: E402
from proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402


async def start_scaler(platform: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scaler.cli",
        "up",
        "--port",
        "0",
        "--platform",
        platform,
        "--policy",
        "demo",
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    while True:
        line = (await proc.stderr.readline()).decode()
        if not line:
            raise SystemExit("scaler up exited before it was ready")
        if m := re.search(r"gRPC [\d.]+:(\d+),", line):
            return proc, f"127.0.0.1:{m.group(1)}"


async def call(scaler: pb_grpc.ScalerStub, key: str, request_id: str) -> tuple[float, float]:
    """One Assign and its Idle; their latencies in ms."""
    meta = pb.Meta(key=key, runtime="python", timeout_in_secs=60, memory_in_mb=128)
    t0 = time.perf_counter()
    reply = await scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta))
    t1 = time.perf_counter()
    await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)))
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000


def row(name: str, samples: list[tuple[float, float]], seconds: float) -> str:
    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1]

    assign, idle = [a for a, _ in samples], [i for _, i in samples]
    return (
        f"| {name} | {len(samples)} | {statistics.median(assign):.2f} | {pct(assign, 99):.2f} "
        f"| {statistics.median(idle):.2f} | {pct(idle, 99):.2f} | {len(samples) / seconds:.0f} |"
    )


async def main(calls: int, functions: int, concurrency: int) -> None:
    stub = PlatformStub("127.0.0.1:0", create_latency_ms=1)
    await stub.start()
    proc, address = await start_scaler(f"127.0.0.1:{stub.port}")
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            scaler = pb_grpc.ScalerStub(channel)
            keys = [f"bench-{n}" for n in range(functions)]
            await asyncio.gather(*(call(scaler, k, f"warm-{k}") for k in keys))  # one warm instance each

            t = time.perf_counter()
            one = [await call(scaler, keys[0], f"seq-{n}") for n in range(calls)]
            one_s = time.perf_counter() - t

            queue = asyncio.Queue()
            for n in range(calls):
                queue.put_nowait(n)
            many: list[tuple[float, float]] = []

            async def worker(key: str) -> None:
                while not queue.empty():
                    n = queue.get_nowait()
                    many.append(await call(scaler, key, f"par-{n}"))

            t = time.perf_counter()
            await asyncio.gather(*(worker(keys[w % functions]) for w in range(concurrency)))
            many_s = time.perf_counter() - t
    finally:
        proc.send_signal(2)
        await proc.wait()
        await stub.stop()
    print("| load | calls | Assign p50 ms | Assign p99 ms | Idle p50 ms | Idle p99 ms | Assign + Idle pairs/s |")
    print("|---|---|---|---|---|---|---|")
    print(row("one function, one call at a time", one, one_s))
    print(row(f"{concurrency} callers over {functions} functions", many, many_s))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--functions", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=50)
    a = p.parse_args()
    asyncio.run(main(a.calls, a.functions, a.concurrency))
