"""A soak: 100k requests over 20k functions through `scaler up`, showing memory and the store bounded.

    python bench/soak.py [--requests N] [--functions F] [--speed S] [--minutes M] [--store-limit-gb G]
                         [--every S] [--policy NAME]

`scaler up` (embedded NATS, the platform stub, the workers, one node, with its metrics) at
`--speed` 20, EVENTS limited to `--store-limit-gb` (0.02: 20 MB), and a limits file that rests a
function 30 s (trace time) after it last had anything to do and forgets it 60 s after. A client in
this process plays a trace in which functions come and go: each is called F/N times (5), a few
seconds of trace time apart, for 20-300 ms each, and the functions' first calls are spread evenly
over `--minutes` of wall time. Every `--every` seconds one row: the requests done and failed, the
functions the node holds in memory (`scaler_functions`), the node's RSS, EVENTS' bytes, messages
and first/last sequence, and the snapshots' bytes (the object store's stream). At the end the node's
state is checked against a replay of what the stream keeps (from the snapshots: `scaler replay
--verify`).
"""

import argparse
import asyncio
import io
import json
import random
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.hot_path import spawn, stop  # noqa: E402
from scaler import replay  # noqa: E402
from scaler.controller.snapshots import BUCKET  # noqa: E402
from scaler.proto import serverless_sim_pb2 as pb  # noqa: E402
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402
from scaler.proto.subjects import EVENTS  # noqa: E402
from scaler.runtime.bus import connected  # noqa: E402
from scaler.runtime.service import run  # noqa: E402

RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
LIMITS = {"rest_after_ms": 30_000, "forget_after_ms": 60_000}
MB = 1e6


@dataclass(frozen=True)
class Call:
    at_s: float  # wall seconds from the start
    request_id: str
    key: str
    run_ms: int  # trace ms


def trace(requests: int, functions: int, wall_s: float, speed: float, seed: int = 0) -> list[Call]:
    """Each function called requests/functions times, 1-20 s of trace time apart; first calls spread over the run."""
    rng = random.Random(seed)
    per = requests // functions
    span_s = per * 20 / speed  # the most one function's calls take, in wall seconds
    calls = []
    for f in range(functions):
        at = f * max(0.0, wall_s - span_s) / functions
        for n in range(per):
            calls.append(Call(at, f"soak-{f}-{n}", f"soak-{f}", rng.randint(20, 300)))
            at += rng.uniform(1, 20) / speed
    return sorted(calls, key=lambda c: c.at_s)


class Client:
    def __init__(self, address: str, speed: float) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.scaler = pb_grpc.ScalerStub(self.channel)
        self.speed = speed
        self.done = 0
        self.failed = 0
        self.retries = 0
        self._tasks: set[asyncio.Task] = set()

    async def play(self, calls: list[Call]) -> None:
        began = time.monotonic()
        for call in calls:
            wait = began + call.at_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(self.one(call))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def one(self, call: Call) -> None:
        meta = pb.Meta(key=call.key, runtime="python", timeout_in_secs=60, memory_in_mb=128)
        try:
            assign = pb.AssignRequest(request_id=call.request_id, meta_data=meta)
            reply = await self._repeated(self.scaler.Assign, assign)
            await asyncio.sleep(call.run_ms / 1000 / self.speed)
            result = pb.Result(status_code=200, duration_in_ms=call.run_ms)
            await self._repeated(self.scaler.Idle, pb.IdleRequest(assigment=reply.assigment, result=result))
            self.done += 1
        except grpc.aio.AioRpcError:
            self.failed += 1

    async def _repeated(self, method, request):
        """A platform repeats a call the scaler could not take just then, with the same request id."""
        for attempt in range(20):
            try:
                return await method(request, timeout=30)
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY or attempt == 19:
                    raise
                self.retries += 1
                await asyncio.sleep(0.2)


def node_pid(up_pid: int) -> int:
    """The `scaler node` among `scaler up`'s children (each part became its process: scaler/runtime/lifeline.py)."""
    children = Path(f"/proc/{up_pid}/task/{up_pid}/children").read_text().split()
    for pid in children:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"scaler" in argv and b"node" in argv:
            return int(pid)
    raise RuntimeError("no `scaler node` under scaler up")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MB
    return 0.0


def functions_held(metrics_url: str) -> int:
    with urllib.request.urlopen(metrics_url, timeout=10) as page:
        found = re.search(rb"^scaler_functions (\S+)$", page.read(), re.M)
    return int(float(found[1])) if found else -1


HEADER = (
    "| wall s | requests done | failed | functions in memory | node RSS MB | EVENTS MB | EVENTS messages"
    " | first seq | last seq | snapshots MB |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


async def row(js, began: float, client: Client, node: int, metrics_url: str) -> str:
    events = (await js.stream_info(EVENTS)).state
    snaps = (await js.stream_info(f"OBJ_{BUCKET}")).state
    held = await asyncio.to_thread(functions_held, metrics_url)
    return (
        f"| {time.monotonic() - began:.0f} | {client.done:,} | {client.failed:,} | {held:,} | {rss_mb(node):.0f}"
        f" | {events.bytes / MB:.1f} | {events.messages:,} | {events.first_seq:,} | {events.last_seq:,}"
        f" | {snaps.bytes / MB:.2f} |"
    )


async def verified(nc, js, when: str) -> str:
    """`scaler replay --verify`: the node's state against a replay of what the stream keeps (from the snapshots)."""
    out = io.StringIO()
    await replay.verify(nc, None, out)
    return f"{when}: {out.getvalue().strip()}"


async def soak(a: argparse.Namespace) -> None:
    calls = trace(a.requests, a.functions, a.minutes * 60, a.speed)
    limits = Path(tempfile.mkdtemp(prefix="soak-")) / "limits.json"
    limits.write_text(json.dumps(LIMITS))
    up, found = await spawn(
        sys.executable, "-m", "scaler", "up", "--port", "0", "--metrics-port", "0", "--policy", a.policy,
        "--speed", str(a.speed), "--store-limit-gb", str(a.store_limit_gb), "--limits", str(limits),
        ready=r"scaler ready: gRPC \S+:(\d+), .* nats (nats://\S+).*metrics http://\S+:(\d+)/metrics",
    )  # fmt: skip
    client = Client(f"127.0.0.1:{found[1]}", a.speed)
    metrics_url = f"http://127.0.0.1:{found[3]}/metrics"
    print(
        f"{a.requests:,} requests over {a.functions:,} functions, speed {a.speed:g}, {a.policy} policy, EVENTS"
        f" limited to {a.store_limit_gb * 1000:g} MB, rest/forget after {LIMITS['rest_after_ms'] // 1000} s /"
        f" {LIMITS['forget_after_ms'] // 1000} s (trace time)\n\n{HEADER}",
        flush=True,
    )
    try:
        node = node_pid(up.pid)
        async with connected(found[2], "soak") as nc:
            js = nc.jetstream()
            began = time.monotonic()
            print(await row(js, began, client, node, metrics_url), flush=True)
            playing = asyncio.create_task(client.play(calls))
            checks = []
            while not playing.done():
                await asyncio.wait([playing], timeout=a.every)
                print(await row(js, began, client, node, metrics_url), flush=True)
                if not checks and (await js.stream_info(EVENTS)).state.first_seq > 1:  # once, mid-run, truncated
                    checks.append(await verified(nc, js, "while it runs"))
            await playing
            await asyncio.sleep(a.tail)  # the last functions retire, rest and are forgotten
            print(await row(js, began, client, node, metrics_url), flush=True)
            checks.append(await verified(nc, js, "at the end"))
            print(f"\nrepeated calls: {client.retries:,}", *checks, sep="\n", flush=True)
    finally:
        await client.channel.close()
        await stop(up)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--functions", type=int, default=20_000)
    p.add_argument("--speed", type=float, default=20.0)
    p.add_argument("--minutes", type=float, default=7.0, help="wall time over which the trace is played")
    p.add_argument("--store-limit-gb", type=float, default=0.02)
    p.add_argument("--every", type=float, default=30.0, help="seconds between rows")
    p.add_argument("--tail", type=float, default=25.0, help="seconds after the last call before the last row")
    p.add_argument("--policy", default="demo")
    run(soak(p.parse_args()))


if __name__ == "__main__":
    main()
