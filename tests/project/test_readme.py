"""The README's tour, run as written in a fresh directory: what a newcomer pastes must work.

The code blocks come out of README.md (tests/codeblocks.py); they run one after the other in one bash
(as pasted into one terminal), with `set -euo pipefail`, in a fresh clone: the repository's tracked
files and a `.venv` (the one these tests run in, standing for "Run it"'s install). The tour names the
default ports; this machine may serve them already (other scalers, other tests), so its commands are
given free ones instead, and nothing else changes.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scaler.runtime.ports import free_port
from tests.codeblocks import ROOT, fresh_clone, shell_blocks

README = ROOT / "README.md"
TOUR = "## A five-minute tour"

pytestmark = pytest.mark.live_trace  # it drives the smoke test through a running scaler


def tour() -> list[str]:
    """The shell blocks of the README's tour, in order."""
    return shell_blocks(README, TOUR)


def on_free_ports(script: str) -> str:
    """The same commands, on ports free here: the Scaler service's, the simulator's platform, metrics."""
    grpc, platform, metrics = free_port(), free_port(), free_port()
    script = script.replace("127.0.0.1:50051", f"127.0.0.1:{platform}").replace("9464", str(metrics))
    script = script.replace("scaler up ", f"scaler up --port {grpc} ")
    script = re.sub(r"^scaler replay", f"scaler replay --gateway 127.0.0.1:{grpc}", script, flags=re.MULTILINE)
    return re.sub(
        r"^(scaler simulate (?!.*--offline).*)$",
        rf"\1 --gateway 127.0.0.1:{grpc} --platform-listen 127.0.0.1:{platform}",
        script,
        flags=re.MULTILINE,
    )


def test_the_readme_tour_runs_as_written_in_a_fresh_clone(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    script = "set -euo pipefail\n" + on_free_ports("\n".join(tour()))
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=clone,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its background `scaler up` too: stopped below if the tour fails
    )
    try:
        out, err = shell.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing of the tour left running, whatever happened
            os.killpg(shell.pid, signal.SIGTERM)
        if shell.poll() is None:
            shell.communicate()
    log = (clone / "scaler.log").read_text() if (clone / "scaler.log").exists() else ""
    assert shell.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}\nscaler.log:\n{log}"
    runs = re.findall(r"^  failedRequestsCount +(\d+)$", out, re.MULTILINE)
    assert runs == ["0", "0"], out  # offline, then live: every request served
    assert re.search(r"^function_smoke_test: offline, policy learned,", out, re.MULTILINE), out
    assert re.search(r"^function_smoke_test: live against .* at speed 1, policy learned,", out, re.MULTILINE), out
    assert re.search(r"^scaler_functions \d", out, re.MULTILINE), out
    assert "scaler stopped" in log and "Traceback" not in log + err, log


def test_the_tours_wait_for_the_ready_line_ends_with_a_scaler_up_that_exited(tmp_path):
    """Port 9001 taken (another scaler, say): `scaler up` exits at once, and so does the wait, showing why."""
    start = next(b for b in tour() if "scaler up " in b).splitlines()
    waiting = start[: next(n for n, line in enumerate(start) if "scaler ready" in line) + 1]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        script = re.sub(r"scaler up --port \d+", f"scaler up --port {port}", on_free_ports("\n".join(waiting)))
        done = subprocess.run(
            ["bash", "-c", f"source {Path(sys.prefix) / 'bin' / 'activate'}\n{script}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,  # a hang guard: the wait used to sit out its whole minute
        )
    said = done.stdout + done.stderr
    assert "scaler ready" not in said, said
    assert re.search(rf"scaler up failed: node: cannot listen on [\d.]+:{port}", said), said
