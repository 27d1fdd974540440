"""What the scaler adds to a call: a bare grpc.aio echo server, the node, and a front gateway + node, side by side.

    python bench/hot_path.py [--json PATH] [--pairs N] [--seconds S] [--rounds N]

Real processes on loopback, and the client in its own process, as a platform would be:
- echo: a Scaler service that answers Assign and Idle at once (the floor of any Python scaler);
- the node's gateway, answering at once: the node's own gRPC service (its checks, its metrics) over a
  router that decides and stores nothing;
- the node's gateway and write path, no decision: the same storing every call as the node does (a group
  commit per function, shared commits across functions, every write synced) and answering once stored:
  what the node's design costs before a single decision, so the rest of the node's figure is the
  controller's own;
- node: `scaler up` (embedded NATS, every write synced to disk, the platform stub, the workers, the
  node), with the default policy (learned), and with demo for the record;
- node, NATS not syncing: the same (learned) on a nats-server with JetStream's default (fsync every 2
  minutes), for the record of what syncing costs;
- front + node: a node of its own (learned), called through `python -m scaler.gateway` (a front gateway
  forwarding over NATS).
For each: warm Assign and Idle latency with one caller, back to back (after every function has its
instance), and for a node the instances it started meanwhile (a policy that retires an instance between
two calls and starts one again before the next: those Assigns are not all warm, and may wait); then
Assign + Idle pairs per second with 50 callers over 50 functions, and with 50 callers on one hot
function; and the Assign p99 under those loads; and the CPU the server spent per pair over the whole
client run (every process of it, its nats-server included, but the platform stub): unlike the rates, a
figure other jobs on the machine move far less. Ratios are to the echo server of the same run. The whole
bench runs `--rounds` times; the table shows each figure's median, then how far the rounds were apart.
`--json` writes the node's figures with the echo server's and the unsynced node's beside them.
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.gateway.server import Gateway  # noqa: E402
from scaler.proto import serverless_sim_pb2 as pb  # noqa: E402
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402
from scaler.proto.commands import Idle, Reply  # noqa: E402
from scaler.proto.subjects import event_subject, function_events  # noqa: E402
from scaler.runtime.bus import connect  # noqa: E402
from scaler.runtime.natsd import NatsServer  # noqa: E402
from scaler.runtime.service import run, stop_on_signals  # noqa: E402
from scaler.store import Append, EventStore  # noqa: E402

FUNCTIONS = 50
CALLERS = 50
_DRAINS: set[asyncio.Task] = set()


class Echo(pb_grpc.ScalerServicer):
    async def Assign(self, request, context):
        a = pb.Assignment(request_id=request.request_id, meta_key=request.meta_data.key, instance_id="echo-1")
        return pb.AssignReply(status=pb.Ok, assigment=a)

    async def Idle(self, request, context):
        return pb.IdleReply(status=pb.Ok)


class Answered:
    """A router that answers every call at once: what the real gateway costs, deciding and storing nothing."""

    async def call(self, cmd, timeout_s):
        return Reply(to="", request_id=cmd.request_id, instance_id=f"{cmd.key}-1")


class Stored:
    """A router that stores every call and decides nothing: the node's write path without the controller.

    Calls of one function arriving while its append is on its way go together in the next one (the node's
    group commit), each append with its function's order check, through the node's shared commits (one
    atomic batch for the functions that meet), on a stream that syncs every write; an Assign answered once
    stored, an Idle at once (its append on its way), as the node answers them."""

    def __init__(self, events: EventStore) -> None:
        self.events = events
        self.lanes: dict[str, list[asyncio.Future]] = {}
        self.last_seq: dict[str, int] = {}

    async def call(self, cmd, timeout_s):
        stored = asyncio.get_running_loop().create_future()
        if (lane := self.lanes.get(cmd.key)) is not None:
            lane.append(stored)
        else:
            self.lanes[cmd.key] = lane = [stored]
            appending = asyncio.create_task(self._append(cmd.key, lane))
            _DRAINS.add(appending)
            appending.add_done_callback(_DRAINS.discard)
        if not isinstance(cmd, Idle):
            await stored
        return Reply(to="", request_id=cmd.request_id, instance_id=f"{cmd.key}-1")

    async def _append(self, key: str, lane: list[asyncio.Future]) -> None:
        while lane:
            group = lane[:]
            lane.clear()
            a = Append(event_subject(key), b"x" * (80 * len(group)), function_events(key), self.last_seq.get(key, 0))
            self.last_seq[key] = await self.events.append(a)
            for stored in group:
                stored.set_result(None)
        del self.lanes[key]


async def serve_floor(kind: str) -> None:
    """Serve one of the floors until SIGTERM, then stop what it started (its nats-server included)."""
    stop = stop_on_signals()
    if kind == "answered":
        await _serve(Gateway(Answered(), listen="127.0.0.1:0"), stop)
        return
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as store:
        async with NatsServer(Path(store) / "nats") as nats:
            nc = await connect(nats.url, "bench-floor")
            try:
                events = EventStore(nc)
                await events.ensure()
                await _serve(Gateway(Stored(events), listen="127.0.0.1:0"), stop)
            finally:
                await nc.close()


async def _serve(gateway: Gateway, stop: asyncio.Event) -> None:
    await gateway.start()
    print(f"floor on 127.0.0.1:{gateway.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await gateway.stop()


async def serve_echo() -> None:
    server = grpc.aio.server()
    pb_grpc.add_ScalerServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"echo on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


# --- the client (its own process) ----------------------------------------------------------------


def meta(n: int) -> pb.Meta:
    return pb.Meta(key=f"bench-{n}", runtime="python", timeout_in_secs=60, memory_in_mb=128)


async def pair(scaler: pb_grpc.ScalerStub, request_id: str, m: pb.Meta) -> tuple[float, float]:
    """One Assign then its Idle; their latencies in ms."""
    t0 = time.perf_counter()
    reply = await scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=m), timeout=60)
    t1 = time.perf_counter()
    result = pb.Result(status_code=200, duration_in_ms=1)
    await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=result), timeout=60)
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(address: str, pairs: int, seconds: float, metrics: str | None = None) -> dict:
    """One caller back to back on `address`, then CALLERS callers over FUNCTIONS functions; with several
    addresses (comma-separated) the load is spread over them, caller by caller. `metrics`: the node's."""
    tag = os.urandom(3).hex()
    channels = [grpc.aio.insecure_channel(a) for a in address.split(",")]
    try:
        return await _measure([pb_grpc.ScalerStub(c) for c in channels], tag, pairs, seconds, metrics)
    finally:
        for c in channels:
            await c.close()


async def _measure(
    scalers: list[pb_grpc.ScalerStub], tag: str, pairs: int, seconds: float, metrics: str | None
) -> dict:
    scaler = scalers[0]
    await asyncio.gather(*(pair(scaler, f"{tag}-warm-{n}", meta(n)) for n in range(FUNCTIONS)))  # cold starts
    for n in range(200):  # warm the path itself
        await pair(scaler, f"{tag}-w{n}", meta(n % FUNCTIONS))
    warm = FUNCTIONS + 200
    assigns, idles = [], []
    before = started(metrics)
    for n in range(pairs):
        a, i = await pair(scaler, f"{tag}-one-{n}", meta(n % FUNCTIONS))
        assigns.append(a)
        idles.append(i)
    after = started(metrics)
    spread, spread_p99, spread_done = await load(scalers, f"{tag}-load", seconds, functions=FUNCTIONS)
    hot, hot_p99, hot_done = await load(scalers, f"{tag}-hot", seconds, functions=1)
    return {
        "pairs_done": warm + pairs + spread_done + hot_done,
        "p50_ms": statistics.median(assigns),
        "p99_ms": pct(assigns, 0.99),
        "idle_p50_ms": statistics.median(idles),
        "idle_p99_ms": pct(idles, 0.99),
        "started": None if before is None else after - before,
        "pairs_per_s": spread,
        "p99_ms_at_load": spread_p99,
        "hot_pairs_per_s": hot,
        "hot_p99_ms_at_load": hot_p99,
    }


def started(metrics: str | None) -> int | None:
    """Instances the node has started so far (for a request waiting, or ahead of one), from its metrics."""
    if metrics is None:
        return None
    with urllib.request.urlopen(metrics, timeout=10) as r:  # the loop has nothing else to do meanwhile
        text = r.read().decode()
    wanted = {"scaler_cold_starts", "scaler_prewarms"}
    return int(sum(s.value for f in text_string_to_metric_families(text) if f.name in wanted for s in f.samples))


async def load(scalers: list[pb_grpc.ScalerStub], tag: str, seconds: float, functions: int) -> tuple[float, float, int]:
    """CALLERS callers back to back over `functions` functions for `seconds`: pairs/s, the Assign p99 and the
    pairs done."""
    done, loaded = 0, []
    stop = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < stop:
            a, _ = await pair(scalers[c % len(scalers)], f"{tag}-{c}-{n}", meta(c % functions))
            loaded.append(a)
            done += 1
            n += 1

    began = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(CALLERS)))
    return done / (time.perf_counter() - began), pct(loaded, 0.99), done


# --- the runner ------------------------------------------------------------------------------------


async def spawn(*argv: str, ready: str, cwd: Path = ROOT) -> tuple[asyncio.subprocess.Process, re.Match]:
    """Start a process (in `cwd`: whose `scaler` `-m` runs) and wait for the line that says it serves; returns it and
    the match."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=cwd
    )
    seen = []
    async with asyncio.timeout(60):
        while True:
            line = (await proc.stdout.readline()).decode()
            if not line:
                raise RuntimeError(f"{argv[:4]} exited: {''.join(seen)[-2000:]}")
            seen.append(line)
            if found := re.search(ready, line):
                _DRAINS.add(asyncio.create_task(_drain(proc)))  # keep reading its output, or it blocks
                return proc, found


async def _drain(proc: asyncio.subprocess.Process) -> None:
    while await proc.stdout.readline():
        pass


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        await proc.wait()


def processes() -> dict[int, tuple[int, float, bytes]]:
    """Every process's parent, CPU seconds so far (user and system) and command line (its words NUL-separated), as
    /proc says ({} where there is none)."""
    proc, tick, found = Path("/proc"), os.sysconf("SC_CLK_TCK"), {}
    if not proc.is_dir():
        return found
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat, cmdline = (d / "stat").read_text(), (d / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from the state on: ppid 2nd, utime 12th, stime 13th
        found[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmdline)
    return found


def descendants(pid: int, found: dict[int, tuple[int, float, bytes]]) -> list[int]:
    """The processes started by `pid`, and by them, and so on (`pid` itself not among them)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in found.items():
        children.setdefault(parent, []).append(child)
    out, frontier = [], [pid]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            out.append(child)
            frontier.append(child)
    return out


def servers_cpu_s() -> float | None:
    """CPU seconds (user and system) the processes this one started have spent so far, and theirs, but the
    platform stub's (the platform's work, not the scaler's); None where there is no /proc to read it from.
    Between two readings around a client run, only the servers under test are alive besides the client,
    whose own CPU is read once it has exited (so not at all)."""
    if not (found := processes()):
        return None
    stub = {pid for pid, (_, _, cmdline) in found.items() if b"scaler.platform_stub" in cmdline}
    return sum(found[pid][1] for pid in descendants(os.getpid(), found) if pid not in stub)


async def client(address: str, pairs: int, seconds: float, metrics: str | None = None) -> dict:
    """The client's figures on `address`, with the CPU the servers spent per pair meanwhile (ms)."""
    before = servers_cpu_s()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", address, "--pairs", str(pairs), "--seconds", str(seconds),
        *(("--metrics", metrics) if metrics else ()),
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the client failed on {address}")
    result = json.loads(out)
    after = servers_cpu_s()
    result["cpu_ms_per_pair"] = None if before is None else (after - before) * 1000 / result["pairs_done"]
    return result


ECHO, ANSWERED, STORED, NODE, DEMO, UNSYNCED, FRONT = (
    "bare grpc.aio echo server",
    "the node's gateway, answering at once",
    "the node's gateway and write path, no decision",
    "node (gRPC + controller), learned",
    "node, demo",
    "node, NATS not syncing",
    "front gateway + node",
)


async def bench(pairs: int, seconds: float) -> dict[str, dict]:
    results: dict[str, dict] = {}
    echo, found = await spawn(sys.executable, __file__, "--serve-echo", ready=r"echo on (\S+)")
    try:
        results[ECHO] = await client(found[1], pairs, seconds)
    finally:
        await stop(echo)
    for name, kind in ((ANSWERED, "answered"), (STORED, "stored")):
        floor, found = await spawn(sys.executable, __file__, "--serve-floor", kind, ready=r"floor on (\S+)")
        try:
            results[name] = await client(found[1], pairs, seconds)
        finally:
            await stop(floor)
    up, found = await up_node("--policy", "demo")
    try:
        results[DEMO] = await client(f"127.0.0.1:{found[1]}", pairs, seconds, found[3])
    finally:
        await stop(up)
    up, found = await up_node()
    try:
        results[NODE] = await client(f"127.0.0.1:{found[1]}", pairs, seconds, found[3])
    finally:
        await stop(up)
    up, found = await up_node()  # its own: on the node row's, its functions would come with that row's history
    try:
        front, at = await spawn(
            sys.executable, "-m", "scaler.gateway", "--nats", found[2], "--listen", "127.0.0.1:0",
            "--log-level", "INFO",
            ready=r"ready: .*gateway on (\S+)",
        )  # fmt: skip
        try:
            results[FRONT] = await client(at[1], pairs, seconds, found[3])
        finally:
            await stop(front)
    finally:
        await stop(up)
    with tempfile.TemporaryDirectory(prefix="bench-unsynced-") as store:
        async with NatsServer(Path(store) / "nats", sync_always=False) as nats:
            up, found = await up_node("--nats", nats.url, "--nats-unsynced")
            try:
                results[UNSYNCED] = await client(f"127.0.0.1:{found[1]}", pairs, seconds, found[3])
            finally:
                await stop(up)
    return results


async def up_node(*argv: str) -> tuple[asyncio.subprocess.Process, re.Match]:
    return await spawn(
        sys.executable, "-m", "scaler", "up", "--port", "0", "--metrics-port", "0", *argv,
        ready=r"scaler ready: gRPC \S+:(\d+), .* nats (nats://\S+) .*metrics (http://\S+)",
    )  # fmt: skip


def table(results: dict[str, dict]) -> str:
    echo = results[ECHO]
    lines = [
        "| server | warm Assign p50 | p99 | Idle p50 | p99 | instances started meanwhile"
        " | pairs/s, 50 callers on 50 functions | Assign p99 | pairs/s, 50 callers on 1 function | Assign p99"
        " | server CPU per pair |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['p50_ms']:.2f} ms ({r['p50_ms'] / echo['p50_ms']:.2f}x) | {r['p99_ms']:.2f} ms"
            f" | {r['idle_p50_ms']:.2f} ms | {r['idle_p99_ms']:.2f} ms | {_count(r.get('started'))}"
            f" | {r['pairs_per_s']:,.0f} ({r['pairs_per_s'] / echo['pairs_per_s']:.0%}) | {r['p99_ms_at_load']:.1f} ms"
            f" | {r['hot_pairs_per_s']:,.0f} ({r['hot_pairs_per_s'] / echo['hot_pairs_per_s']:.0%})"
            f" | {r['hot_p99_ms_at_load']:.1f} ms | {_cpu(r, echo)} |"
        )
    lines.append("")
    lines.append("(x and %: of the echo server's figure in the same run)")
    floor, node = results[STORED], results[NODE]
    spread, hot = node["pairs_per_s"] / floor["pairs_per_s"], node["hot_pairs_per_s"] / floor["hot_pairs_per_s"]
    lines.append(
        f"the node (learned) against its floor (gateway and write path): {spread:.0%} of its pairs/s on 50"
        f" functions, {hot:.0%} on one, a warm Assign {node['p50_ms'] / floor['p50_ms']:.2f}x its p50"
        + (f", {node['cpu_ms_per_pair'] / cpu:.2f}x its CPU per pair" if (cpu := floor["cpu_ms_per_pair"]) else "")
    )
    lines.append(
        f"the front gateway adds {results[FRONT]['p50_ms'] - results[NODE]['p50_ms']:.2f} ms to a warm Assign (p50)"
    )
    return "\n".join(lines)


def medians(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Each row's figures, each the median of the rounds' (a figure a round did not measure stays None)."""
    return {
        name: {
            k: None if any(r[name].get(k) is None for r in rounds) else statistics.median(r[name][k] for r in rounds)
            for k in rows
        }
        for name, rows in rounds[0].items()
    }


def spread(rounds: list[dict[str, dict]]) -> str:
    """How far the rounds were apart: each row's pairs/s on 50 functions and warm Assign p50, round by round."""
    lines = [f"{len(rounds)} rounds, the table their medians; round by round, pairs/s on 50 functions and warm p50:"]
    for name in rounds[0]:
        each = ", ".join(f"{r[name]['pairs_per_s']:,.0f} / {r[name]['p50_ms']:.2f} ms" for r in rounds)
        lines.append(f"  {name}: {each}")
    return "\n".join(lines)


def _cpu(r: dict, echo: dict) -> str:
    ms, base = r.get("cpu_ms_per_pair"), echo.get("cpu_ms_per_pair")
    return "" if ms is None else f"{ms:.2f} ms ({ms / base:.2f}x)" if base else f"{ms:.2f} ms"


def _count(n: float | None) -> str:
    return "" if n is None else f"{n:,.0f}"


def figures(results: dict[str, dict]) -> dict:
    """The node's figures, the echo server's, the floors' and the unsynced node's beside them, and the ratios to
    the echo."""
    node, echo, unsynced, front = results[NODE], results[ECHO], results[UNSYNCED], results[FRONT]
    keys = (
        *("p50_ms", "p99_ms", "idle_p50_ms", "started"),
        *("pairs_per_s", "p99_ms_at_load", "hot_pairs_per_s", "hot_p99_ms_at_load", "cpu_ms_per_pair"),
    )
    return {
        **{k: node[k] for k in keys},
        "echo_p50_ms": echo["p50_ms"],
        "echo_pairs_per_s": echo["pairs_per_s"],
        "echo_hot_pairs_per_s": echo["hot_pairs_per_s"],
        "p50_over_echo": node["p50_ms"] / echo["p50_ms"],
        "pairs_share_of_echo": node["pairs_per_s"] / echo["pairs_per_s"],
        "hot_pairs_share_of_echo": node["hot_pairs_per_s"] / echo["hot_pairs_per_s"],
        "front_p50_ms": front["p50_ms"],
        "front_pairs_per_s": front["pairs_per_s"],
        "unsynced": {k: unsynced[k] for k in keys},
        "gateway_answering": {k: results[ANSWERED][k] for k in keys},
        "gateway_and_write_path": {k: results[STORED][k] for k in keys},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="write the node's figures (and the echo server's) here")
    p.add_argument("--pairs", type=int, default=2000, help="Assign + Idle pairs with one caller")
    p.add_argument("--seconds", type=float, default=10.0, help="how long 50 callers run")
    p.add_argument("--rounds", type=int, default=3, help="runs of the whole bench; the table shows their medians")
    p.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    p.add_argument("--metrics", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-floor", choices=["answered", "stored"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_echo:
        run(serve_echo())
        return
    if args.serve_floor:
        run(serve_floor(args.serve_floor))
        return
    if args.client:
        print(json.dumps(run(measure(args.client, args.pairs, args.seconds, args.metrics))))
        return
    rounds = [run(bench(args.pairs, args.seconds)) for _ in range(args.rounds)]
    results = medians(rounds)
    print(table(results))
    print(spread(rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(figures(results), indent=2) + "\n")


if __name__ == "__main__":
    main()
