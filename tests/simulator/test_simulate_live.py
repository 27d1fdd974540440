"""Live mode against the real scaler: where it agrees with offline, and what holds however loaded the machine is."""

import asyncio
import contextlib
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scaler.controller.core.policy import get_policy
from scaler.runtime.clock import Clock
from scaler.runtime.ports import free_port
from scaler.simulator import shapes
from scaler.simulator.dataset import load_dataset
from scaler.simulator.live import LiveError, LiveRun, run_live
from scaler.simulator.offline import simulate
from scaler.simulator.score import RUN_TAIL_MS
from tests.cli.test_up import http_get, part_pid, start_up, stop
from tests.decisions import Decisions
from tests.live_run import simulate_live
from tests.simulator.test_simulate import SHARED, STATS_FIELDS, gentle, meta, request, write_dataset
from tests.stack import Stack

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
    # Each of those waited for its slot's CreateSlot and Init, which the platform did after the Assign came and
    # before it was answered: counted at their nominal length, as offline counts them, and the scaler's own work on top.
    assert all(live.invocations[n].schedule_ms >= offline.invocations[n].schedule_ms for n in unavoidable), [
        (live.invocations[n].schedule_ms, offline.invocations[n].schedule_ms) for n in unavoidable
    ]


def bursts(folder: Path) -> Path:
    """Three functions called in bursts of 2 to 5 requests at once, each request 500 ms, the next burst of a
    function a second after the last one began: within a burst every request needs an instance of its own,
    and between bursts every instance is idle again with half a second to spare."""
    sizes = {"a": [2, 3, 5, 3, 2, 4, 5, 1], "b": [1, 1, 2, 1, 3, 3], "c": [4, 2, 4, 5, 5, 1, 2]}
    requests = [
        request(n * 1000 + k * 3 + offset, key, duration=500)
        for offset, (key, burst) in enumerate(zip(sizes, sizes.values(), strict=True))
        for n, size in enumerate(burst)
        for k in range(size)
    ]
    return write_dataset(folder, [meta(key, init=100) for key in sizes], sorted(requests, key=lambda r: r["startTime"]))


async def test_the_demo_policy_starts_live_the_instances_it_starts_offline(nats_url, tmp_path, monkeypatch):
    """Live at speed 1, the node with the demo policy starts exactly the instances the core starts offline on a
    trace whose bursts leave the scaler's latency half a second to spare: a release is applied before the next
    burst (none stored late, none undone by a plan), a plan retires nothing demo keeps, and no request of a burst
    starts an instance another's freed would have served. Every decision is the core's on what the node saw."""
    decisions = Decisions(monkeypatch)
    live, offline = await replay(nats_url, bursts(tmp_path / "b"), speed=1, tail_ms=0)
    assert live.stats().failed_requests_count == 0
    await decisions.check(nats_url, "demo")
    assert offline.stats().cold_starts == 5 + 3 + 5  # the largest burst of each function
    assert (live.stats().cold_starts, live.slots_created) == (offline.stats().cold_starts, offline.slots_created)


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
    await decisions.check(nats_url, "learned")
    assert sum(f.arrivals for f in decisions.features.values()) == 2731


async def test_a_scaler_using_another_platform_is_refused(nats_url, tmp_path):
    dataset = load_dataset(gentle(tmp_path / "g"))
    async with Stack(nats_url, metas=dataset.metas, clock=Clock(100)) as stack:  # the stack's own platform
        with pytest.raises(LiveError, match="an instance this simulator's platform never started"):
            await run_live(dataset, f"127.0.0.1:{stack.gateway.port}", 100, "127.0.0.1:0")


async def test_simulate_drives_scaler_up_end_to_end(tmp_path):
    run = await simulate_live(gentle(tmp_path / "g"), tmp_path / "up", "demo", "--json", str(tmp_path / "out.json"))
    # no progress bar without a terminal; where the statistics went
    assert run.err == f"scaler simulate: the statistics written to {tmp_path / 'out.json'}\n"
    stats = json.loads((tmp_path / "out.json").read_text())
    assert set(stats) == STATS_FIELDS | {"functions"}
    assert (stats["totalRequestsCount"], stats["failedRequestsCount"]) == (6, 0)
    assert 5 <= stats["coldStarts"] <= 6  # the demo policy's unavoidable starts; a3's reuse depends on the machine
    assert "at speed 100" in run.out
    assert "the scaler's own latency unscaled" in run.out


async def test_sigterm_stops_a_live_run_cleanly(tmp_path):
    # As PID 1 in a container SIGTERM has no default action: unhandled, the simulator would run on
    # until Docker kills it. A gateway that accepts the connection but never speaks holds the run at
    # its start, past the point where the handler is set; unhandled here, SIGTERM would kill it (-15).
    accepted = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: accepted.set(), "127.0.0.1", 0)
    gateway = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    command = [sys.executable, "-m", "scaler", "simulate", str(gentle(tmp_path / "g")), "--gateway", gateway]
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


# --- the setup is checked at the start; a run shows its progress and its statistics so far (issue 12) ---


async def simulate_cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler", "simulate", *map(str, args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def finished(proc: asyncio.subprocess.Process, seconds: float) -> tuple[int | None, str]:
    """Its exit status and stderr; None if it had to be killed after `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            _, err = await proc.communicate()
            return proc.returncode, err.decode()
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
        return None, err.decode()


async def test_a_scaler_at_another_speed_is_refused_before_the_first_request(tmp_path):
    platform = f"127.0.0.1:{free_port()}"
    proc, gateway, _ = await start_up("--platform", platform, "--speed", "1")
    try:
        simulator = await simulate_cli(
            gentle(tmp_path / "g"), "--gateway", gateway, "--platform-listen", platform, "--speed", "100"
        )
        code, err = await finished(simulator, 30)
        assert code == 1, err
        assert err == (
            f"scaler simulate: error: the scaler at {gateway} runs at speed 1 and this simulation at 100:"
            " start both with the same --speed\n"
        )
    finally:
        await stop(proc)


async def test_a_scaler_using_another_platform_is_refused_at_its_first_answer(tmp_path):
    proc, gateway, _ = await start_up()  # with its own platform stub, not the simulator's
    try:
        simulator = await simulate_cli(gentle(tmp_path / "g"), "--gateway", gateway, "--platform-listen", "127.0.0.1:0")
        code, err = await finished(simulator, 60)  # the whole trace, at speed 1, would take 7 minutes
        assert code == 1, err
        assert "error: the scaler's first answer is a-1, an instance this simulator's platform never started" in err
    finally:
        await stop(proc)


def steady(folder: Path, n: int = 40, every_ms: int = 2000) -> Path:
    """`n` requests of one function, `every_ms` apart: a run that goes on steadily."""
    return write_dataset(folder, [meta("s", init=100)], [request(i * every_ms, "s") for i in range(n)])


async def test_a_live_run_shows_progress_and_serves_its_statistics_so_far(tmp_path):
    platform = f"127.0.0.1:{free_port()}"
    proc, gateway, _ = await start_up("--platform", platform, "--speed", "10", "--policy", "demo")
    try:
        simulator = await simulate_cli(
            steady(tmp_path / "s"), "--gateway", gateway, "--platform-listen", platform, "--speed", "10",
            "--progress-every", "0.5", "--stats-port", "0",
        )  # fmt: skip
        first = (await simulator.stderr.readline()).decode()
        url = re.fullmatch(r"statistics so far: (http://127\.0\.0\.1:\d+/stats)\n", first).group(1)
        seen = []
        async with asyncio.timeout(30):
            while True:  # fetched while the run goes on
                status, body = await http_get(url)
                assert status == 200
                seen.append(json.loads(body))
                if 10 <= seen[-1]["requestsDone"] < 40:
                    break
                await asyncio.sleep(0.2)
        code, err = await finished(simulator, 60)
        assert code == 0, err
    finally:
        await stop(proc)
    now = seen[-1]
    assert now["requestsTotal"] == 40 and now["inFlight"] <= 1
    assert now["traceSecs"] >= 2 * (now["requestsDone"] - 1)  # requests come every 2 s of trace
    stats = now["statistics"]
    assert set(stats) == STATS_FIELDS
    assert stats["totalRequestsCount"] == now["requestsDone"]
    # One instance serves them all on a quiet machine; on a loaded one a request's Idle may come after the next
    # one's Assign (0.2 s apart in real time), which then starts another: what the page says is the run's own.
    assert stats["failedRequestsCount"] == 0 and 1 <= stats["coldStarts"] <= now["requestsDone"]
    lines = [line for line in err.splitlines() if line.startswith("progress: ")]
    assert len(lines) >= 5, err  # about 8 s of run, a line every 0.5 s
    done = [int(re.search(r"(\d+)/40 requests", line).group(1)) for line in lines]
    assert done == sorted(done) and done[0] < done[-1]
    assert "\r" not in err  # no bar outside a terminal


async def test_a_live_run_retries_through_a_node_restart_as_a_platform_does(tmp_path):
    """The node killed with -9 mid-run: `scaler up` starts it again on its port, and the simulator sends each call
    the scaler refused as unavailable meanwhile again (the same request), so the restart costs time, not requests."""
    platform = f"127.0.0.1:{free_port()}"
    proc, gateway, _ = await start_up("--platform", platform, "--speed", "10", "--policy", "demo")
    try:
        simulator = await simulate_cli(
            steady(tmp_path / "s", n=60, every_ms=1000), "--gateway", gateway, "--platform-listen", platform,
            "--speed", "10", "--progress-every", "0.2",
        )  # fmt: skip
        async with asyncio.timeout(60):
            while True:  # until some requests are done
                line = (await simulator.stderr.readline()).decode()
                assert line, "the run ended before the node was killed"
                if (m := re.search(r" (\d+)/60 requests", line)) and int(m.group(1)) >= 10:
                    break
        os.kill(part_pid(proc, "scaler node"), signal.SIGKILL)
        async with asyncio.timeout(120):
            out, err = (b.decode() for b in await simulator.communicate())
    finally:
        code, rest = await stop(proc)
    assert simulator.returncode == 0, err
    assert code == 0 and "node was killed by SIGKILL; starting it again" in rest, rest
    assert re.search(r"^  totalRequestsCount +60$", out, re.MULTILINE), out
    assert re.search(r"^  failedRequestsCount +0$", out, re.MULTILINE), out
    retried = re.search(r"^retried, each with the same request, as a platform does: (.*)$", out, re.MULTILINE)
    assert retried and "UNAVAILABLE" in retried.group(1), out


def test_an_offline_run_shows_progress_as_lines_in_a_log_and_as_a_bar_on_a_terminal(tmp_path):
    folder = shapes.write(shapes.generate("mixed", 0), tmp_path / "mixed")
    # The demo policy: what is shown does not depend on it, and it decides the 17,974 requests 4x faster than learned.
    command = [sys.executable, "-m", "scaler", "simulate", str(folder), "--offline", "--policy", "demo"]
    command += ["--progress-every", "0.2"]
    logged = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert logged.returncode == 0, logged.stderr
    lines = logged.stderr.splitlines()
    assert len(lines) >= 3 and all(re.match(r"progress: \d+% [\d,]+/17,974 requests, trace ", x) for x in lines)
    # On a terminal: one bar, redrawn in place, ending at 100 %.
    parent, child = pty.openpty()
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=child) as bar:
        os.close(child)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the child closed its end
            while chunk := os.read(parent, 4096):
                shown += chunk
        assert bar.wait(timeout=120) == 0
    os.close(parent)
    text = shown.decode()
    assert text.count("\r[") >= 2 and "progress:" not in text
    assert f"\r[{'#' * 30}] 17,974/17,974 requests" in text
