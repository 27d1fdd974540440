"""What an idle scaler costs: the CPU each process of `scaler up` spends a minute while no call comes.

    python bench/idle.py [--seconds S] [--rounds N] [--root DIR]

A node with nothing to decide still renews its partitions' leases, shares its totals, reads the tenants'
quotas, watches its event loop and its store. That work runs beside every call a live node takes, on the
same two cores as its nats-server, so it is part of what a call waits for; idle, it is all there is to see.
Each round starts `scaler up` (embedded NATS syncing every write, the platform stub, the workers, the
node), lets it settle, then reads each process's CPU (user and system, from /proc) over `--seconds`.
The table shows seconds of CPU a minute by process, the median of the rounds and how far they were apart.
`--root` runs another checkout's `scaler` (a commit to compare with: `git worktree add DIR REV`).
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.hot_path import descendants, processes, spawn, stop  # noqa: E402

SETTLE_S = 10.0  # after the ready line: the first lease rounds, snapshots and listings are a start's, not idling
ROLES = {  # a word of the process's command line -> the row it counts in
    b"nats-server": "nats-server",
    b"scaler.platform_stub": "platform stub",
    b"scaler.workers": "workers",
    b"node": "node",
    b"up": "scaler up (its supervisor)",
}


def cpu_by_role(root_pid: int) -> dict[str, float]:
    """CPU seconds each kind of process under `root_pid` (itself included) has spent so far."""
    found, out = processes(), {}
    for pid in [root_pid, *descendants(root_pid, found)]:
        if pid in found:
            words = found[pid][2].split(b"\0")
            role = next((r for w, r in ROLES.items() if any(x == w or x.endswith(b"/" + w) for x in words)), "other")
            out[role] = out.get(role, 0.0) + found[pid][1]
    return out


async def one_round(root: Path, seconds: float) -> dict[str, float]:
    """Seconds of CPU a minute by process, over `seconds` of an idle `scaler up` run from `root`."""
    with tempfile.TemporaryDirectory() as data:
        argv = (sys.executable, "-m", "scaler", "up", "--port", "0", "--data-dir", data)
        proc, _ = await spawn(*argv, ready=r"scaler ready", cwd=root)
        try:
            await asyncio.sleep(SETTLE_S)
            before = cpu_by_role(proc.pid)
            await asyncio.sleep(seconds)
            after = cpu_by_role(proc.pid)
        finally:
            await stop(proc)
    return {role: (after[role] - before.get(role, 0.0)) * 60 / seconds for role in after}


def table(rounds: list[dict[str, float]]) -> str:
    roles = sorted({r for one in rounds for r in one}, key=lambda r: -statistics.median(x.get(r, 0) for x in rounds))
    lines = ["| process | CPU s a minute, median | rounds' spread | each |", "|---|---:|---:|---:|"]
    for role in [*roles, "all"]:
        each = [sum(x.values()) if role == "all" else x.get(role, 0.0) for x in rounds]
        figures = ", ".join(f"{v:.2f}" for v in each)
        lines.append(f"| {role} | {statistics.median(each):.2f} | {max(each) - min(each):.2f} | {figures} |")
    return "\n".join(lines)


async def main(seconds: float, rounds: int, root: Path) -> None:
    results = [await one_round(root, seconds) for _ in range(rounds)]
    print(f"idle `scaler up` from {root}, {rounds} round(s) of {seconds:g} s")
    print(table(results))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long each round measures (after settling)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose scaler runs")
    a = p.parse_args()
    asyncio.run(main(a.seconds, a.rounds, a.root.resolve()))
