"""`scaler simulate` driving a `scaler up` from the outside, as the docs tell a user to: the one setup of the tests
that run a trace live end to end."""

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from scaler.runtime.ports import free_port
from tests.cli.test_up import start_up, stop


@dataclass
class LiveRun:
    """What the simulator printed, and the first lines of the `scaler up` it drove."""

    out: str
    err: str
    up_lines: list[str]


async def simulate_live(folder: Path, data_dir: Path, policy: str, *simulate_args: str) -> LiveRun:
    """Run the trace in `folder` through a `scaler up --policy POLICY` at speed 100, the simulator its platform, and
    stop the node; both must exit 0. `simulate_args` go to `scaler simulate` (`--json`, `--report`, ...)."""
    platform = f"127.0.0.1:{free_port()}"
    up = ("--platform", platform, "--speed", "100", "--policy", policy, "--data-dir", str(data_dir))
    proc, gateway, lines = await start_up(*up)
    try:
        simulator = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "scaler", "simulate", str(folder), "--gateway", gateway),
            *("--platform-listen", platform, "--speed", "100", *simulate_args),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await simulator.communicate()
    finally:
        code, rest = await stop(proc)
    assert simulator.returncode == 0, err.decode()
    assert code == 0, rest
    return LiveRun(out.decode(), err.decode(), lines)
