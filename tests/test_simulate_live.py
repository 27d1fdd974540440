"""Live mode against the real scaler: where it agrees with offline, and what holds however loaded the machine is."""

import asyncio
import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from controller.core.policy import get_policy
from runtime.clock import Clock
from simulator.dataset import load_dataset
from simulator.live import LiveError, LiveRun, run_live
from simulator.offline import simulate
from simulator.score import RUN_TAIL_MS
from tests.decisions import Decisions
from tests.stack import Stack
from tests.test_simulate import SHARED, STATS_FIELDS, gentle
from tests.test_up import start_up, stop

pytestmark = pytest.mark.live_trace


async def replay(nats_url: str, folder: Path, speed: float, policy: str = "demo", tail_ms: int = RUN_TAIL_MS):
    """Both modes on one trace; `tail_ms`: how long the run goes on after the last Idle (in trace time)."""
    dataset = load_dataset(folder)
    clock = Clock(speed)
    async with Stack(nats_url, metas=dataset.metas, create_latency_ms=100, clock=clock, policy=policy) as stack:
        driver = LiveRun(dataset, stack.scaler, stack.stub, stack.clock, tail_ms=tail_ms)
        run = await driver.run()
    assert not driver.errors(), driver.errors()
    return run, simulate(dataset, get_policy(policy), tail_ms=tail_ms)


def window(source: Path, folder: Path, from_s: int, to_s: int) -> Path:
    """The requests of `source` that arrive from `from_s` to `to_s` seconds into it, as a dataset."""
    folder.mkdir(parents=True)
    shutil.copy(source / "metas", folder / "metas")
    t0 = load_dataset(source).start_ms
    lines = (source / "requests").read_bytes().splitlines()
    kept = [
        line for line in lines if line.strip() and from_s * 1000 <= json.loads(line)["startTime"] - t0 < to_s * 1000
    ]
    (folder / "requests").write_bytes(b"\n".join(kept) + b"\n")
    return folder


async def test_live_on_a_gentle_trace_decides_as_the_core(nats_url, tmp_path, monkeypatch):
    # Every event of this trace is seconds apart: at speed 100 (5 ms of scaler work is 500 ms of
    # trace) a quiet machine decides as offline does, a loaded one may not (a3 may find the instance
    # it would reuse still busy: seen at load 9). What holds on any machine: every request served,
    # every decision the core's on what the controller saw, the starts the demo policy cannot avoid
    # (a1 and b1 call first, a2 comes while a1 runs, b2 after b1's instance died with its request, a4
    # after both a's expired) and at most one per request, and waiting counted at least as the
    # platform's work, as offline (the scaler's own latency adds to it, unscaled).
    decisions = Decisions(monkeypatch)
    live, offline = await replay(nats_url, gentle(tmp_path / "g"), speed=100)
    assert live.stats().failed_requests_count == 0
    await decisions.check(nats_url, "demo")
    unavoidable = [0, 1, 3, 4, 5]
    assert [live.invocations[n].cold for n in unavoidable] == [offline.invocations[n].cold for n in unavoidable]
    assert all(offline.invocations[n].cold for n in unavoidable) and not offline.invocations[2].cold
    assert offline.slots_created == 5 <= live.slots_created <= 6
    live_s, offline_s = live.stats().invocation_schedule_time_in_secs, offline.stats().invocation_schedule_time_in_secs
    assert offline_s <= live_s


@pytest.mark.skipif(not (SHARED / "dataSet_1").is_dir(), reason=f"the shared datasets are not at {SHARED}")
async def test_our_policy_live_on_dataSet_1s_busiest_minute_decides_as_the_core(nats_url, tmp_path, monkeypatch):
    # One minute of dataSet_1's final burst: 2,731 requests of 20-40 ms, 45 a second, on three
    # functions. Live, the learned policy sees every request a little later and every instance busy
    # a little longer than offline (the scaler's own latency, more on a loaded machine), so its pools
    # and cold starts drift from offline's by what the machine's speed does: `python bench/live.py`
    # measures that. What holds on any machine: every request is served, and every decision is the
    # core's on what the controller saw, with the run's totals it had (the exchange rate included).
    decisions = Decisions(monkeypatch)
    folder = window(SHARED / "dataSet_1", tmp_path / "peak", 18_600, 18_660)
    live, offline = await replay(nats_url, folder, speed=1, policy="learned", tail_ms=0)
    live_stats = live.stats()
    assert live_stats.total_requests_count == offline.stats().total_requests_count == 2731
    assert live_stats.failed_requests_count == 0
    states = await decisions.check(nats_url, "learned")
    assert sum(s.stats.arrivals for s in states.values()) == 2731


async def test_a_scaler_using_another_platform_is_refused(nats_url, tmp_path):
    dataset = load_dataset(gentle(tmp_path / "g"))
    async with Stack(nats_url, metas=dataset.metas, clock=Clock(100)) as stack:  # the stack's own platform
        with pytest.raises(LiveError, match="none of which this simulator's platform started"):
            await run_live(dataset, f"127.0.0.1:{stack.gateway.port}", 100, "127.0.0.1:0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_simulate_drives_scaler_up_end_to_end(tmp_path):
    folder = gentle(tmp_path / "g")
    platform = f"127.0.0.1:{free_port()}"
    up = ("--platform", platform, "--speed", "100", "--policy", "demo", "--data-dir", str(tmp_path / "up"))
    proc, gateway, _ = await start_up(*up)
    try:
        simulator = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "scaler.cli",
            "simulate",
            str(folder),
            "--gateway",
            gateway,
            "--platform-listen",
            platform,
            "--speed",
            "100",
            "--json",
            str(tmp_path / "out.json"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await simulator.communicate()
    finally:
        code, rest = await stop(proc)
    assert simulator.returncode == 0, err.decode()
    assert code == 0, rest
    assert err == b""  # no progress bar without a terminal
    stats = json.loads((tmp_path / "out.json").read_text())
    assert set(stats) == STATS_FIELDS | {"functions"}
    assert (stats["totalRequestsCount"], stats["failedRequestsCount"]) == (6, 0)
    assert 5 <= stats["coldStarts"] <= 6  # the demo policy's unavoidable starts; a3's reuse depends on the machine
    assert "at speed 100" in out.decode()
    assert "the scaler's own latency unscaled" in out.decode()


async def test_sigterm_stops_a_live_run_cleanly(tmp_path):
    # As PID 1 in a container SIGTERM has no default action: unhandled, the simulator would run on
    # until Docker kills it. A gateway that accepts the connection but never speaks holds the run at
    # its start, past the point where the handler is set; unhandled here, SIGTERM would kill it (-15).
    accepted = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: accepted.set(), "127.0.0.1", 0)
    gateway = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    command = [sys.executable, "-m", "scaler.cli", "simulate", str(gentle(tmp_path / "g")), "--gateway", gateway]
    command += ["--platform-listen", "127.0.0.1:0"]
    simulator = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(30):
            await accepted.wait()
            simulator.terminate()
            _, err = await simulator.communicate()
    finally:
        server.close()
        if simulator.returncode is None:
            simulator.kill()
            await simulator.wait()
    assert (simulator.returncode, err.decode()) == (143, "scaler simulate: stopped by SIGTERM\n")
