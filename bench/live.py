"""Live against offline on the same trace and policy, beside two references: the cost of storing apart from the node's.

    python bench/live.py [--scenarios smoke busiest-minute] [--rounds 3] [--datasets-dir DIR] [--probe]
                         [--scalers NAME ...] [--against REV]

Each scenario runs once offline (the pure core on a virtual clock: the scaler takes no time) and
live at speed 1, driven by `scaler simulate`'s live mode, through four scalers, each `--rounds` times
(one round is each scaler once, in turn): the in-memory reference (bench/memory_scaler.py: the demo
policy, storing nothing, the floor of a Python gRPC scaler on this machine), the durable reference
(bench/durable_scaler.py: the same decisions, each a synced event on its own nats-server, group commit,
one event a call: the node's storage contract in as few lines as it takes), `scaler up --policy demo`
(the same policy in the node) and `scaler up` with the default policy (learned). Live, every call takes
the scaler's own time, which offline counts as zero; "live - offline" is what the machine and the
scaler's own work cost the score. The durable reference less the in-memory one is what storing costs;
the node with demo less the durable reference is what the node's own machinery costs. Each live run's
own latency is measured (scaler/simulator/latency.py: from the node's events and the run's records; a
reference, which keeps no events the simulator can read, from the records alone) and the scenario is
played offline on it with the run's policy: "live - on its latency" is what that model misses. Prints
every round, then the medians (score, cold starts, Assign and Idle seconds) with how far the rounds
spread, and each scaler's score less the durable reference's round by round: a round runs the scalers
one right after the other, and the machine's speed, which drifts over minutes and moves a score more
than the gaps measured here, moves a round's two sides more alike than two medians; then `learned` and
`demo` played offline on each scaler's latency (what each policy would score live on a scaler that
fast), a warm Assign's latency and the Idle's over the run and in its busiest second, and slot GB·s
per function; on this machine, under whatever else it runs. With `--probe`, five tables more: what each scaler's
processes spent each run on, recorded from inside them (bench/probe/sitecustomize.py), and each call's time on its
way to the scaler's handler, in it, and back. `--scalers` runs only those named (the durable reference always: it is
what each is measured against); `lean node, demo` and `lean node, learned` only when named: the node's core (its
ledger, the policy) in the durable reference's shape (bench/lean_node.py), so that the durable reference less it is
what the core costs live, and it less the node what the node's path costs. `--against REV` measures a change: each
node scaler chosen runs twice a round, as this checkout and as a git worktree of REV (`node, demo @ REV`, its processes
on that checkout's code), one right after the other, and a last table gives this checkout's score less REV's round by
round.

- smoke: function_smoke_test (806 of its 980 requests within one second);
- busiest-minute: dataSet_1 from 18,600 s to 18,660 s (2,731 requests of 20-40 ms, 45 a second, on
  three functions).
"""

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.controller.core.policy import get_policy  # noqa: E402
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc  # noqa: E402
from scaler.runtime.natsd import NatsServer  # noqa: E402
from scaler.runtime.ports import free_port  # noqa: E402
from scaler.simulator.dataset import Dataset, load_dataset  # noqa: E402
from scaler.simulator.latency import Latency  # noqa: E402
from scaler.simulator.live import run_live  # noqa: E402
from scaler.simulator.offline import simulate  # noqa: E402
from scaler.simulator.score import Run  # noqa: E402

DATASETS_DIR = ROOT.parent / "shared" / "datasets"


def window(source: Path, folder: Path, from_s: int, to_s: int) -> Path:
    """The requests of `source` that arrive from `from_s` to `to_s` seconds into it, as a dataset."""
    folder.mkdir(parents=True)
    (folder / "metas").write_bytes((source / "metas").read_bytes())
    t0 = load_dataset(source).start_ms
    lines = (source / "requests").read_bytes().splitlines()
    kept = [line for line in lines if line.strip() and from_s <= (json.loads(line)["startTime"] - t0) / 1000 < to_s]
    (folder / "requests").write_bytes(b"\n".join(kept) + b"\n")
    return folder


def scenarios(datasets: Path, scratch: Path) -> dict[str, Path]:
    return {
        "smoke": ROOT / "tests" / "fixtures" / "function_smoke_test",
        "busiest-minute": window(datasets / "dataSet_1", scratch / "peak", 18_600, 18_660),
    }


NODE_READY = r"gRPC [\d.]+:(\d+),"  # `scaler up`'s ready line names its gRPC port


def node(policy: str) -> tuple[Callable[[str, str], list[str]], str, str]:
    return (
        lambda platform, _: ["-m", "scaler", "up", "--port", "0", "--platform", platform, "--policy", policy],
        NODE_READY,
        policy,
    )


def lean(policy: str) -> tuple[Callable[[str, str], list[str]], str, str]:
    script = str(ROOT / "bench" / "lean_node.py")
    return (
        lambda platform, nats: [script, "--platform", platform, "--nats", nats, "--policy", policy],
        r"lean node on [\d.]+:(\d+)",
        policy,
    )


DURABLE = "durable reference"
# The scalers that are this repository's code (the references are benches), as SCALERS has them.
NODES = {"node, demo": node("demo"), "node, learned": node("learned")}
# The node's core in the durable reference's shape (bench/lean_node.py), run when named: what the core costs live
# apart from the node's path.
LEAN = {f"lean node, {policy}": lean(policy) for policy in ("demo", "learned")}

# Each scaler: its command (given the platform's address and a synced nats-server's), the line saying where it
# listens, and its policy.
SCALERS = {
    "in-memory reference": (
        lambda platform, _: [str(ROOT / "bench" / "memory_scaler.py"), "--platform", platform],
        r"memory scaler on [\d.]+:(\d+)",
        "demo",
    ),
    DURABLE: (
        lambda platform, nats: [str(ROOT / "bench" / "durable_scaler.py"), "--platform", platform, "--nats", nats],
        r"durable scaler on [\d.]+:(\d+)",
        "demo",
    ),
    **LEAN,
    **NODES,
}
STORED = {DURABLE, *LEAN}  # given a synced nats-server of their own each (the node starts its own)
DEFAULT = [s for s in SCALERS if s not in LEAN]  # what a run measures unless told


@contextlib.asynccontextmanager
async def serving(scaler: str, platform: str, probe: Path | None = None) -> AsyncIterator[tuple[str, deque[str]]]:
    """One of SCALERS started against `platform` (the durable reference on a synced nats-server of its own): its
    address once it says it is ready, and the last lines it said (all of them once it stopped); stopped after. With
    `probe`, a folder, its processes record into it what they spend the run on (bench/probe/sitecustomize.py)."""
    argv, ready, _ = SCALERS[base_name(scaler)]
    root = CHECKOUTS.get(scaler, ROOT)
    with tempfile.TemporaryDirectory() as store:
        async with NatsServer(Path(store) / "nats") if scaler in STORED else contextlib.nullcontext() as nats:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *argv(platform, nats.url if nats else ""), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, cwd=root, env=checkout_env(root, probe),
            )  # fmt: skip
            said: deque[str] = deque(maxlen=20)  # its last lines, shown should a run fail
            drain = None
            try:
                while not (m := re.search(ready, (line := (await proc.stdout.readline()).decode()))):
                    if not line:
                        raise SystemExit(f"{scaler} exited before it was ready")
                # Read on, or a scaler that says more than a pipe holds blocks mid-run on its next line.
                drain = asyncio.create_task(_drain(proc, said))
                yield f"127.0.0.1:{m.group(1)}", said
            finally:
                await stop(proc)
                if drain is not None:
                    await drain


async def _drain(proc: asyncio.subprocess.Process, said: deque[str]) -> None:
    while line := await proc.stdout.readline():
        said.append(line.decode(errors="replace"))


async def live(dataset: Dataset, scaler: str, probe: Path | None = None) -> tuple[Run, Latency]:
    platform = f"127.0.0.1:{free_port()}"
    async with serving(scaler, platform, probe) as (address, said):
        with timed_calls(probe / SENT) if probe else contextlib.nullcontext():
            outcome = await run_live(dataset, address, 1.0, platform, latency=True)
    if outcome.errors:
        print(f"{dataset.name}, {scaler}: failed calls {dict(outcome.errors)}; its last lines:", file=sys.stderr)
        print("".join(said), file=sys.stderr)
    return outcome.run, outcome.latency


async def stop(proc: asyncio.subprocess.Process) -> None:
    """Ctrl-C, and kill -9 should the scaler not be gone 10 s later (a scaler that hangs is not waited for ever)."""
    proc.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()


PROBE = ROOT / "bench" / "probe"
SENT = "sent"  # in a probed run's folder: when this process sent each call, and had its answer


@contextlib.contextmanager
def timed_calls(into: Path) -> Iterator[None]:
    """Each Assign and Idle the simulator sends meanwhile, by request id: when it was sent and answered
    (`time.monotonic()`, the clock the probed scaler stamps its handlers with), written to `into` after."""
    sent: dict[str, list[tuple[float, float, str]]] = {"Assign": [], "Idle": []}
    made = pb_grpc.ScalerStub.__init__

    def timed(method: str, call, request_id):
        async def send(request, *args, **kwargs):
            began = time.monotonic()
            try:
                return await call(request, *args, **kwargs)
            finally:
                sent[method].append((began, time.monotonic(), request_id(request)))

        return send

    def make(stub, channel) -> None:
        made(stub, channel)
        stub.Assign = timed("Assign", stub.Assign, lambda r: r.request_id)
        stub.Idle = timed("Idle", stub.Idle, lambda r: r.assigment.request_id)

    pb_grpc.ScalerStub.__init__ = make
    try:
        yield
    finally:
        pb_grpc.ScalerStub.__init__ = made
        into.write_text(json.dumps(sent))


def checkout_env(root: Path, probe: Path | None = None) -> dict[str, str]:
    """The environment of a scaler run from the checkout at `root`: that checkout first on the path of its processes
    (those `scaler up` starts too), before the installed package's; with `probe`, a folder, they record what they
    spend the run on into it, the probe first on the path (it imports `scaler` before `-m` puts the working
    directory there, and would otherwise measure the installed package's code rather than the checkout's)."""
    first = (str(PROBE), str(root)) if probe else (str(root),)
    path = os.pathsep.join(p for p in (*first, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **({"SCALER_PROBE_DIR": str(probe)} if probe else {})}


AGAINST = " @ "  # a scaler run from another checkout: "node, demo @ 3dc810c"
CHECKOUTS: dict[str, Path] = {}  # such a scaler's checkout (the others run from this one)


def base_name(scaler: str) -> str:
    """The scaler of SCALERS that `scaler` runs, from whichever checkout."""
    return scaler.partition(AGAINST)[0]


@contextlib.contextmanager
def worktree(rev: str, into: Path) -> Iterator[str]:
    """A git worktree of `rev` at `into`, removed after; its name: `rev` as git abbreviates its commit."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", f"{rev}^{{commit}}"], capture_output=True, text=True)
    if commit.returncode:
        raise SystemExit(f"--against {rev}: {commit.stderr.strip() or 'not a commit'}")
    subprocess.run([*git, "worktree", "add", "--detach", "--quiet", str(into), rev], check=True)
    try:
        yield commit.stdout.strip()
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(into)], check=False)


def process_name(argv: list[str]) -> str:
    first = Path(argv[0]).parent.name if argv else ""
    if first == "workers":
        return "workers"
    if argv[1:2] in (["node"], ["up"]):
        return argv[1]
    return Path(argv[0]).stem if argv else "?"


def probe_rows(run: str, folder: Path) -> list[list[str]]:
    """Five tables' rows from one run's probes: each process's loop, its longest steps by task, its NATS requests,
    the node's lanes, and where the calls' time went."""
    loops, steps, requests, lanes = [], [], [], []
    handled: dict[str, dict[str, tuple[float, float]]] = {"Assign": {}, "Idle": {}}
    for f in sorted(folder.glob("*.json")):
        d = json.loads(f.read_text())
        for method, calls in d.get("handled", {}).items():
            handled[method].update((request_id, (entered, ms)) for entered, ms, request_id in calls)
        name, loop = process_name(d["argv"]), d["loop"]
        counts = loop["callbacks"]
        if not sum(counts):
            continue
        over_1ms = sum(c for c, b in zip(counts[1:], loop["bounds_ms"], strict=True) if b >= 1)
        full = d["full"]  # (s into the process's life, ms)
        at, longest = max(full, key=lambda c: c[1], default=(0.0, 0.0))
        loops.append(
            f"| {run} | {name} | {sum(counts):,} | {loop['ms'] / 1000:.2f} | {over_1ms} "
            f"| {len(full)} | {longest:.1f} ({at:.1f} s) |"
        )
        for task, (n, ms) in sorted(d["long"].items(), key=lambda kv: -kv[1][1])[:5]:
            steps.append(f"| {run} | {name} | {task[:110]} | {n:,} | {ms / n:.3f} |")
        for subject, ms in sorted(d["requests"].items(), key=lambda kv: -len(kv[1])):
            slow = sum(1 for m in ms if m >= 3)
            requests.append(
                f"| {run} | {name} | {subject} | {len(ms):,} | {pct(ms, 0.5):.2f} | {pct(ms, 0.99):.2f} "
                f"| {max(ms):.1f} | {slow} |"
            )
        for what, ms in sorted(d["lanes"].items()):
            lanes.append(f"| {run} | {what} | {len(ms):,} | {pct(ms, 0.5):.3f} | {statistics.fmean(ms):.3f} "
                         f"| {pct(ms, 0.99):.3f} |")  # fmt: skip
    return [loops, steps, requests, lanes, call_rows(run, handled, json.loads((folder / SENT).read_text()))]


def call_rows(
    run: str, handled: dict[str, dict[str, tuple[float, float]]], sent: dict[str, list[tuple[float, float, str]]]
) -> list[str]:
    """Each call kind's time split three ways, the simulator's stamps joined with the scaler's by request id: on its
    way to the handler (gRPC's transport; its server taking calls in one at a time, each a few turns of the scaler's
    event loop), in the handler, and back to the simulator."""
    rows = []
    for method, calls in sent.items():
        parts: tuple[list[float], list[float], list[float]] = ([], [], [])
        for began, answered, request_id in calls:
            if (seen := handled[method].get(request_id)) is not None:
                entered, ms = seen
                split = ((entered - began) * 1000, ms, (answered - entered) * 1000 - ms)
                for part, value in zip(parts, split, strict=True):
                    part.append(value)
        if parts[0]:
            cells = " | ".join(f"{pct(v, 0.5):.2f} / {statistics.fmean(v):.2f} / {pct(v, 0.99):.1f}" for v in parts)
            rows.append(f"| {run} | {method} | {len(parts[0]):,} | {cells} |")
    return rows


PROBE_TABLES = (
    "| run | process | loop callbacks | their s | of 1 ms or more | full collections | longest ms (s into its life) |\n"
    "|---|---|---:|---:|---:|---:|---:|",
    "| run | process | a step of 0.25 ms or more, by task (its coroutines at the step's end) | steps | mean ms |\n"
    "|---|---|---|---:|---:|",
    "| run | process | NATS request to | n | p50 ms | p99 ms | max ms | 3 ms or more |\n"
    "|---|---|---|---:|---:|---:|---:|---:|",
    "| run | in the node's lanes | n | p50 ms | mean ms | p99 ms |\n|---|---|---:|---:|---:|---:|",
    "| run | call | n | to its handler, p50 / mean / p99 ms | in it | back to the caller |\n"
    "|---|---|---:|---:|---:|---:|",
)


def row(name: str, scaler: str, n: int, run: Run, offline: Run, played: Run) -> str:
    s, o, p = run.stats(), offline.stats(), played.stats()
    calls = s.invocation_schedule_time_in_secs + s.invocation_idle_time_in_secs
    return (
        f"| {name} | {scaler} | {n} | {s.total_requests_count:,} | {s.failed_requests_count} | {s.cold_starts:,} "
        f"| {run.slot_gb_s:,.1f} | {s.invocation_schedule_time_in_secs:,.1f} | {s.invocation_idle_time_in_secs:,.1f} "
        f"| {calls:,.1f} | {o.score:.2f} | {s.score:.2f} | {s.score - o.score:+.2f} | {p.score:.2f} "
        f"| {s.score - p.score:+.2f} |"
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def call_latency(dataset: Dataset, run: Run) -> str:
    """A warm Assign's p50 / mean (ms: the run's records are whole ms, so the mean tells scalers apart), and Idle
    p50 / p99 over the run and within its busiest second (by the trace's arrivals)."""
    seconds = [r.start_time // 1000 for r in dataset.requests]
    busiest = Counter(seconds).most_common(1)[0][0]
    warm = [i.schedule_ms for i in run.invocations if not i.cold]
    idle = [i.idle_ms for i in run.invocations]
    burst = [i.idle_ms for i, second in zip(run.invocations, seconds, strict=True) if second == busiest]
    warm_cell = f"{statistics.median(warm):.1f} / {statistics.fmean(warm):.3f}" if warm else "-"
    return (
        f"{warm_cell} | {statistics.median(idle):.1f} / {pct(idle, 0.99):.1f} | {len(burst)} "
        f"| {statistics.median(burst):.1f} / {pct(burst, 0.99):.1f}"
    )


POLICIES = ("learned", "demo")


def paired(runs: list[tuple[str, str, int, Run, Run, Run]], name: str, scaler: str, to: str = DURABLE) -> list[float]:
    """The scaler's live score less `to`'s (the durable reference's) in the same round, round by round."""
    other = {n: on.stats().score for m, sc, n, on, _, _ in runs if (m, sc) == (name, to)}
    return [on.stats().score - other[n] for m, sc, n, on, _, _ in runs if (m, sc) == (name, scaler)]


def lineup(scalers: list[str], against: str = "") -> list[str]:
    """The scalers a round runs, in SCALERS' order, the durable reference among them; with `against` (a commit's
    name), each node scaler followed by itself run from that commit's checkout."""
    out = []
    for scaler in SCALERS:
        if scaler in scalers or scaler == DURABLE:
            out.append(scaler)
            if against and scaler in NODES:
                out.append(f"{scaler}{AGAINST}{against}")
    return out


async def main(
    names: list[str], datasets: Path, rounds: int, probe: bool = False, scalers: list[str] | None = None,
    against: str | None = None,
) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        with worktree(against, Path(scratch) / "against") if against else contextlib.nullcontext("") as commit:
            chosen = lineup(scalers or DEFAULT, commit)
            CHECKOUTS.update({s: Path(scratch) / "against" for s in chosen if AGAINST in s})
            await measure(names, datasets, rounds, probe, chosen, Path(scratch))


async def measure(names: list[str], datasets: Path, rounds: int, probe: bool, chosen: list[str], scratch: Path) -> None:
    runs: list[tuple[str, str, int, Run, Run, Run]] = []
    probes: list[list[list[str]]] = []  # each probed run's rows of PROBE_TABLES
    played: dict[tuple[str, str, str], list[float]] = {}  # (scenario, scaler, policy) -> scores on its latencies
    offline_scores: dict[tuple[str, str], float] = {}
    latency: list[str] = []
    paths = scenarios(datasets, scratch)
    for name in names:
        dataset = load_dataset(paths[name])
        offline = {policy: simulate(dataset, get_policy(policy)) for policy in POLICIES}
        offline_scores.update({(name, policy): run.stats().score for policy, run in offline.items()})
        for n in range(1, rounds + 1):
            for scaler in chosen:
                policy = SCALERS[base_name(scaler)][2]
                folder = scratch / f"probe-{name}-{scaler}-{n}".replace(" ", "-") if probe else None
                if folder:
                    folder.mkdir()
                on, model = await live(dataset, scaler, folder)
                if folder:
                    probes.append(probe_rows(f"{name}, {scaler}, {n}", folder))
                on_its = {p: simulate(dataset, get_policy(p), latency=model) for p in POLICIES}
                for p, run in on_its.items():
                    played.setdefault((name, scaler, p), []).append(run.stats().score)
                runs.append((name, scaler, n, on, offline[policy], on_its[policy]))
                latency.append(f"| {name} | {scaler} | {n} | {call_latency(dataset, on)} |")
    print(
        "| scenario | scaler | round | requests | failed | cold starts | slot GB·s | Assign s | Idle s | calls s "
        "| offline score | live score | live - offline | offline on its latency | live - on its latency |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, scaler, n, on, offline, on_its_own in runs:
        print(row(name, scaler, n, on, offline, on_its_own))
    print()
    print(
        "| scenario | scaler | live score, median | rounds' spread | cold starts, median (offline) | Assign s, median"
        " | Idle s, median | live - offline, median | to the durable reference | round by round: median (each) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        durable = statistics.median(on.stats().score for m, sc, _, on, _, _ in runs if (m, sc) == (name, DURABLE))
        for scaler in chosen:
            each = paired(runs, name, scaler)
            mine = [(on.stats(), offline.stats()) for m, sc, _, on, offline, _ in runs if (m, sc) == (name, scaler)]
            scores = [s.score for s, _ in mine]
            score, offline = statistics.median(scores), mine[0][1]
            print(
                f"| {name} | {scaler} | {score:.2f} | {max(scores) - min(scores):.2f}"
                f" | {statistics.median(s.cold_starts for s, _ in mine):g} ({offline.cold_starts})"
                f" | {statistics.median(s.invocation_schedule_time_in_secs for s, _ in mine):.1f}"
                f" | {statistics.median(s.invocation_idle_time_in_secs for s, _ in mine):.1f}"
                f" | {statistics.median(s.score - o.score for s, o in mine):+.2f} | {score - durable:+.2f}"
                f" | {statistics.median(each):+.2f} ({', '.join(f'{d:+.2f}' for d in each)}) |"
            )
    print()
    print(
        "| scenario | on the latency of | learned, median | learned - its offline | demo, median"
        " | demo - its offline | that scaler's own live - offline, median |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        for scaler in chosen:
            learned, demo = (statistics.median(played[name, scaler, p]) for p in POLICIES)
            own = statistics.median(
                on.stats().score - offline.stats().score
                for m, sc, _, on, offline, _ in runs
                if (m, sc) == (name, scaler)
            )
            print(
                f"| {name} | {scaler} | {learned:.2f} | {learned - offline_scores[name, 'learned']:+.2f}"
                f" | {demo:.2f} | {demo - offline_scores[name, 'demo']:+.2f} | {own:+.2f} |"
            )
    print()
    print(
        "| scenario | scaler | round | warm Assign p50 / mean ms | Idle p50 / p99 ms | busiest second: requests"
        " | its Idle p50 / p99 ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(latency))
    print()
    for i, header in enumerate(PROBE_TABLES if probes else ()):
        print(header)
        print("\n".join(r for rows in probes for r in rows[i]))
        print()
    if against := [scaler for scaler in chosen if AGAINST in scaler]:
        print("| scenario | scaler | this checkout less the other, round by round: median (each) | cold starts, each |")
        print("|---|---|---:|---|")
        for name in names:
            for other in against:
                scaler = base_name(other)
                each = paired(runs, name, scaler, other)
                colds = {
                    sc: [on.stats().cold_starts for m, s, _, on, _, _ in runs if (m, s) == (name, sc)]
                    for sc in (scaler, other)
                }  # fmt: skip
                pairs = ", ".join(f"{a} / {b}" for a, b in zip(colds[scaler], colds[other], strict=True))
                print(
                    f"| {name} | {scaler} against {other.partition(AGAINST)[2]} | {statistics.median(each):+.2f}"
                    f" ({', '.join(f'{d:+.2f}' for d in each)}) | {pairs} |"
                )
        print()
    print("| scenario | scaler | round | function | offline slot GB·s | live slot GB·s | live / offline |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name, scaler, n, on, offline, _ in runs:
        for key, gb_s in sorted(offline.slot_gb_s_by_key.items(), key=lambda kv: -kv[1])[:3]:
            there = on.slot_gb_s_by_key.get(key, 0.0)
            print(
                f"| {name} | {scaler} | {n} | {key} | {gb_s:,.1f} | {there:,.1f} | {there / gb_s if gb_s else 0:.2f} |"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["smoke", "busiest-minute"]
    p.add_argument("--scenarios", nargs="+", default=names, choices=names)
    p.add_argument("--rounds", type=int, default=3, help="runs of each scaler (medians over them)")
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR)
    p.add_argument(
        "--probe", action="store_true", help="also what each scaler's processes spend a run on (bench/probe/)"
    )
    p.add_argument(
        "--scalers", nargs="+", choices=list(SCALERS), metavar="NAME", default=DEFAULT,
        help=f"the scalers to run ({', '.join(SCALERS)}; all but the lean nodes unless named); the durable reference"
        " always",
    )  # fmt: skip
    p.add_argument(
        "--against", metavar="REV", help="each node scaler also run from a worktree of this commit, in the same rounds"
    )
    a = p.parse_args()
    asyncio.run(main(a.scenarios, a.datasets_dir, a.rounds, a.probe, a.scalers, a.against))
