"""Where a warm Assign's and an Idle's time goes in the node at a live trace's pace, beside the references.

    python bench/stages.py [--pairs N] [--rounds N] [--policy P]

A live run is not the hot path's back-to-back loop: dataSet_1's busiest minute sends 45 requests a second
(an Assign and an Idle each) over three functions, and between two calls the machine idles. So each scaler
here is called that way: one caller, three functions warm, an Assign, 10 ms (the call runs), its Idle, 5 ms,
the next function's; `--pairs` timed pairs after 30 a function of warm-up. First the client's view of every
scaler, one after another in each of `--rounds` rounds (the medians of the rounds' figures, and how far
apart they were): the in-memory and durable references of bench/live.py and `scaler up` (demo, and
`--policy`). Then the node again, in a process of its own (on uvloop, as `scaler up`) with a clock stamp at
each stage of the command path (the same classes, each method wrapped; the stamps add a few us), and for
each stage the median time from the one before it, taken from the gateway's handler: what the caller waits
for (an Assign's path to its stored answer, an Idle's to its answer) and what the node does behind an Idle's
answer.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import live  # noqa: E402
from scaler.platform_stub.server import PlatformStub  # noqa: E402
from scaler.proto import serverless_sim_pb2 as pb  # noqa: E402
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402
from scaler.runtime import service  # noqa: E402
from scaler.runtime.natsd import NatsServer  # noqa: E402

KEYS = ("a", "b", "c")
WARM = 30  # pairs per function before the timed ones
RUN_S, REST_S = 0.010, 0.005  # between an Assign's answer and its Idle; between a pair and the next

# The command path's stages, in the order a call takes them: (stamp, what ends there).
ASSIGN = (
    ("door>", "the gateway's handler: the command made"),
    ("submit>", "the door: routed, admitted, its answer expected"),
    ("group>", "queued in its function's lane, taken by the lane's runner"),
    ("decide>", "the lane: the store settled, the lease checked"),
    ("respond<", "the decision (core.respond)"),
    ("append>", "its batch made, handed to the writer"),
    ("request>", "the writer and the store: the order check, the shared commit"),
    ("request<", "nats-server: stored (synced) and acked"),
    ("commit<", "the ack read, the decision committed to the ledger"),
    ("door<", "the reply delivered to the door"),
    ("handler<", "the gateway's answer made"),
)
IDLE = (
    ("door>", "the gateway's handler: the command made"),
    ("door<", "the door: routed, its release sure, answered"),
    ("handler<", "the gateway's answer made"),
    ("submit>", "behind the answer: handed to its lane"),
    ("group>", "taken by the lane's runner"),
    ("respond<", "the release decided (core.respond)"),
    ("append>", "the plan decided, riding in the release's batch"),
    ("request<", "the writer, the store, nats-server: stored and acked"),
    ("commit<", "the ledger committed"),
)


def meta(key: str) -> pb.Meta:
    return pb.Meta(key=key, runtime="python", timeout_in_secs=60, memory_in_mb=256)


async def paced(address: str, pairs: int) -> tuple[list[float], list[float]]:
    """Warm pairs at a live trace's pace; each timed Assign's and Idle's latency (ms), as the caller sees it."""
    async with grpc.aio.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)

        async def pair(request_id: str, key: str) -> tuple[float, float]:
            began = time.perf_counter()
            reply = await scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta(key)), timeout=30)
            assigned = time.perf_counter()
            await asyncio.sleep(RUN_S)
            idle = time.perf_counter()
            result = pb.Result(status_code=200, duration_in_ms=10)
            await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=result), timeout=30)
            return (assigned - began) * 1e3, (time.perf_counter() - idle) * 1e3

        for n in range(WARM):
            for key in KEYS:
                await pair(f"warm-{n}-{key}", key)
        assigns, idles = [], []
        for n in range(pairs):
            a, i = await pair(f"timed-{n}", KEYS[n % len(KEYS)])
            assigns.append(a)
            idles.append(i)
            await asyncio.sleep(REST_S)
    return assigns, idles


async def client_view(scaler: str, pairs: int) -> tuple[list[float], list[float]]:
    """One of bench/live.py's scalers, on a platform stub of this process, called at the live pace."""
    stub = PlatformStub("127.0.0.1:0", None, 20)
    await stub.start()
    try:
        async with live.serving(scaler, f"127.0.0.1:{stub.port}") as (address, _):
            return await paced(address, pairs)
    finally:
        await stub.stop()


async def stamped_view(policy: str, pairs: int) -> dict[str, dict[str, float]]:
    """The node in a process of its own with its stages stamped (`--serve-stamped`): each stage's median ms."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-stamped", "--policy", policy, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    port = int((await proc.stdout.readline()).decode())
    await paced(f"127.0.0.1:{port}", pairs)
    out, _ = await proc.communicate(b"")
    return json.loads(out)


async def serve_stamped(policy: str) -> None:
    """A node (tests/stack.py's: embedded in this process with its platform stub and workers) whose command path
    stamps each stage; prints its port, and once stdin closes each stage's median (ms after the one before)."""
    from tests.stack import Stack

    calls: list[dict[str, float]] = []
    _stamp_the_path(calls)
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            NatsServer(Path(tmp) / "nats") as nats,
            Stack(nats.url, policy=policy, nats_monitor=nats.monitor_url) as stack,
        ):
            print(stack.gateway.port, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    kinds = {"Assign": ASSIGN, "Idle": IDLE}
    print(json.dumps({kind: _medians([c for c in calls if c["kind"] == kind], kinds[kind]) for kind in kinds}))


def _medians(calls: list[dict], stages: tuple[tuple[str, str], ...]) -> dict[str, float]:
    medians, before = {}, "handler>"
    for stamp, _ in stages:
        took = [c[stamp] - c[before] for c in calls if stamp in c and before in c]
        medians[stamp] = statistics.median(took) * 1e3 if took else float("nan")
        before = stamp
    return medians


def _stamp_the_path(calls: list[dict]) -> None:
    """Wrap the command path's methods so each call records when it reached each stage (the first time only)."""
    import nats.aio.client

    from scaler.controller import ledger
    from scaler.controller.path import door, lane, lanes, writer
    from scaler.gateway import server

    current: dict[str, float] | None = None  # the timed call under way, None during a warm-up one

    def stamp(name: str) -> None:
        if current is not None and name not in current:
            current[name] = time.perf_counter()

    def wrap(owner, attr: str, name: str) -> None:
        f = getattr(owner, attr)
        if asyncio.iscoroutinefunction(f):

            async def wrapped(*a, **k):
                stamp(f"{name}>")
                try:
                    return await f(*a, **k)
                finally:
                    stamp(f"{name}<")
        else:

            def wrapped(*a, **k):
                stamp(f"{name}>")
                try:
                    return f(*a, **k)
                finally:
                    stamp(f"{name}<")

        setattr(owner, attr, wrapped)

    def handler(attr: str, request_id) -> None:
        f = getattr(server.Gateway, attr)

        async def wrapped(self, request, context):
            nonlocal current
            current = {"kind": attr} if request_id(request).startswith("timed-") else None
            if current is not None:
                calls.append(current)
            stamp("handler>")
            try:
                return await f(self, request, context)
            finally:
                stamp("handler<")

        setattr(server.Gateway, attr, wrapped)

    handler("Assign", lambda r: r.request_id)
    handler("Idle", lambda r: r.assigment.request_id)
    wrap(door.Door, "call", "door")
    wrap(lanes.Lanes, "submit", "submit")
    wrap(lanes.Lanes, "_group", "group")
    wrap(ledger.Ledger, "decide", "decide")
    wrap(ledger.core, "respond", "respond")
    wrap(writer.Writer, "append", "append")
    wrap(nats.aio.client.Client, "request", "request")
    wrap(lane.Lane, "commit", "commit")


def report(
    views: dict[str, list[tuple[list[float], list[float]]]], stages: dict[str, dict[str, float]], policy: str
) -> str:
    lines = [
        "| scaler | warm Assign p50 | mean | Idle p50 | mean | rounds' spread of the Assign's mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, rounds in views.items():
        figures = [
            [statistics.median(assigns), statistics.fmean(assigns), statistics.median(idles), statistics.fmean(idles)]
            for assigns, idles in rounds
        ]
        medians = [statistics.median(column) for column in zip(*figures, strict=True)]
        means = [f[1] for f in figures]
        lines.append(
            f"| {name} | " + " | ".join(f"{m:.2f} ms" for m in medians) + f" | {max(means) - min(means):.2f} ms |"
        )
    for kind, order in (("Assign", ASSIGN), ("Idle", IDLE)):
        lines += ["", f"| the node ({policy}), a warm {kind}: stage | ms, median |", "|---|---:|"]
        lines += [f"| {what} | {stages[kind][stamp]:.3f} |" for stamp, what in order]
    return "\n".join(lines)


async def main(pairs: int, rounds: int, policy: str) -> None:
    names = ["in-memory reference", live.DURABLE, "node, demo", *([f"node, {policy}"] if policy != "demo" else [])]
    live.SCALERS.setdefault(f"node, {policy}", live.node(policy))
    views: dict[str, list] = {name: [] for name in names}
    for n in range(rounds):
        for name in names:
            views[name].append(await client_view(name, pairs))
            print(f"round {n + 1}, {name}: done", file=sys.stderr, flush=True)
    print(report(views, await stamped_view(policy, pairs), policy))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policy", default="learned", help="the node's stages are stamped with this policy")
    p.add_argument("--serve-stamped", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_stamped:
        service.run(serve_stamped(a.policy))  # on uvloop, as `scaler up` runs
    else:
        asyncio.run(main(a.pairs, a.rounds, a.policy))
