"""Live against offline on the same trace and policy: how far the machine's speed moves the figures.

    python bench/live.py [--scenarios smoke busiest-minute] [--datasets-dir DIR]

Each scenario runs once offline (the pure core on a virtual clock: the scaler takes no time) and
once live at speed 1 through `scaler up` (each part its own process, as deployed) driven by
`scaler simulate`'s live mode. Live, every request reaches the controller a little late and every
instance stays busy a little longer (the scaler's own latency, more on a loaded machine), so the
policy sees another load and decides accordingly: the tests check that it decides as the core does
on what it saw (tests/decisions.py); this measures how far that moves cold starts, slots, slot
GB·s and waiting ("schedule ms/request over offline" is mostly the scaler's own latency, which
offline counts as zero). Prints three tables (the runs; the Idle calls' latency over the run and in
its busiest second, with the offline `demo` policy's score beside; and slot GB·s per function);
one run each, on this machine, under whatever else it runs.

- smoke: function_smoke_test, demo policy (806 of its 980 requests within one second);
- smoke-learned: the same with our policy;
- busiest-minute: dataSet_1 from 18,600 s to 18,660 s, learned policy (2,731 requests of 20-40 ms,
  45 a second, on three functions).
"""

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.controller.core.policy import get_policy  # noqa: E402
from scaler.runtime.ports import free_port  # noqa: E402
from scaler.simulator.dataset import Dataset, load_dataset  # noqa: E402
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


def scenarios(datasets: Path, scratch: Path) -> dict[str, tuple[Path, str]]:
    return {
        "smoke": (ROOT / "tests" / "fixtures" / "function_smoke_test", "demo"),
        "smoke-learned": (ROOT / "tests" / "fixtures" / "function_smoke_test", "learned"),
        "busiest-minute": (window(datasets / "dataSet_1", scratch / "peak", 18_600, 18_660), "learned"),
    }


async def live(dataset: Dataset, policy: str) -> Run:
    platform = f"127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "scaler", "up", "--port", "0", "--platform", platform, "--policy", policy),
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        while not (m := re.search(r"gRPC [\d.]+:(\d+),", (line := (await proc.stderr.readline()).decode()))):
            if not line:
                raise SystemExit("scaler up exited before it was ready")
        outcome = await run_live(dataset, f"127.0.0.1:{m.group(1)}", 1.0, platform)
        if outcome.errors:
            print(f"{dataset.name}: failed calls {dict(outcome.errors)}", file=sys.stderr)
        return outcome.run
    finally:
        proc.send_signal(2)
        await proc.communicate()


def row(name: str, mode: str, run: Run, offline: Run) -> str:
    s = run.stats()
    extra_s = s.invocation_schedule_time_in_secs - offline.stats().invocation_schedule_time_in_secs
    return (
        f"| {name} | {mode} | {s.total_requests_count:,} | {s.failed_requests_count} | {s.cold_starts:,} "
        f"| {run.slots_created:,} | {run.slot_gb_s:,.1f} | {s.invocation_schedule_time_in_secs:,.1f} "
        f"| {extra_s * 1000 / s.total_requests_count:.1f} | {s.invocation_idle_time_in_secs:,.1f} | {s.score:.2f} |"
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def idle_latency(dataset: Dataset, run: Run) -> str:
    """Idle p50 / p99 (ms) over the run and within its busiest second (by the trace's arrivals)."""
    seconds = [r.start_time // 1000 for r in dataset.requests]
    busiest = Counter(seconds).most_common(1)[0][0]
    idle = [i.idle_ms for i in run.invocations]
    burst = [i.idle_ms for i, second in zip(run.invocations, seconds, strict=True) if second == busiest]
    return (
        f"{statistics.median(idle):.1f} / {pct(idle, 0.99):.1f} | {len(burst)} "
        f"| {statistics.median(burst):.1f} / {pct(burst, 0.99):.1f}"
    )


async def main(names: list[str], datasets: Path) -> None:
    runs: list[tuple[str, Run, Run]] = []
    latency: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        chosen = scenarios(datasets, Path(scratch))
        for name in names:
            folder, policy = chosen[name]
            dataset = load_dataset(folder)
            offline, on = simulate(dataset, get_policy(policy)), await live(dataset, policy)
            runs.append((f"{name} ({policy})", offline, on))
            demo = simulate(dataset, get_policy("demo")).stats().score
            latency.append(f"| {name} ({policy}) | {idle_latency(dataset, on)} | {on.stats().score:.2f} | {demo:.2f} |")
    print(
        "| scenario | mode | requests | failed | cold starts | slots | slot GB·s | schedule s "
        "| schedule ms/request over offline | idle s | score |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, offline, on in runs:
        print(row(name, "offline", offline, offline))
        print(row(name, "live, speed 1", on, offline))
    print()
    print("| scenario | Idle p50 / p99 ms | busiest second: requests | its Idle p50 / p99 ms | live score "
          "| offline `demo` score |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(latency))
    print()
    print("| scenario | function | offline slot GB·s | live slot GB·s | live / offline |")
    print("|---|---|---:|---:|---:|")
    for name, offline, on in runs:
        for key, gb_s in sorted(offline.slot_gb_s_by_key.items(), key=lambda kv: -kv[1])[:5]:
            there = on.slot_gb_s_by_key.get(key, 0.0)
            print(f"| {name} | {key} | {gb_s:,.1f} | {there:,.1f} | {there / gb_s if gb_s else 0:.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["smoke", "smoke-learned", "busiest-minute"]
    p.add_argument("--scenarios", nargs="+", default=names, choices=names)
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR)
    a = p.parse_args()
    asyncio.run(main(a.scenarios, a.datasets_dir))
