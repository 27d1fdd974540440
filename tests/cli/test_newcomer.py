"""What a new user meets around `scaler up`: a prompt stop however it ends, and one clear line for a bad start."""

import asyncio
import contextlib
import gc
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from scaler.runtime.bus import close, connect
from scaler.runtime.natsd import NatsServer, server_binary
from scaler.runtime.ports import free_port
from scaler.workers import __main__ as workers_main
from scaler.workers import effects
from tests import compose
from tests.cli.test_up import alive, descendants, http_get, part_pid, reap, run_cli, served, start_up, stop
from tests.simulator.test_simulate import meta, request, write_dataset
from tests.simulator.test_simulate_live import finished, simulate_cli, steady
from tests.stack import eventually

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


async def test_a_killed_scaler_up_frees_its_ports_at_once_when_its_nats_went_with_it():
    """kill -9 of `scaler up` takes its embedded NATS down too: the node has nowhere to save its snapshots
    or give its leases back, so it must leave at once rather than wait out NATS's timeouts on its port."""
    port = free_port()
    proc, address, _ = await start_up("--port", str(port))
    parts = descendants(proc.pid)
    node, nats = part_pid(proc, "scaler node"), part_pid(proc, "bin/nats-server")
    said = ""
    try:
        assert await served(address, "held") == "held-1"  # a partition served: a snapshot to write at stop
        proc.kill()
        await eventually(lambda: not alive(nats), 30)
        # Waiting on the gone NATS took 11 s and more; leaving at once takes well under a second, and up to 5 s
        # on a machine loaded by a fault suite beside it: 8 s tells the two apart on either.
        try:
            await eventually(lambda: not alive(node), 8)
        except TimeoutError:  # where it waits, in its log (scaler up's stderr, which the node still holds)
            with contextlib.suppress(ProcessLookupError):  # gone just now: too late all the same
                os.kill(node, signal.SIGUSR2)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3):
                    while chunk := await proc.stderr.read(1 << 16):
                        said += chunk.decode(errors="replace")
            raise AssertionError(f"the node still runs 8 s after its NATS died:\n{said[-12_000:]}") from None
        said += (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        assert "could not write the snapshot" not in said and "Traceback" not in said, said
        again, address, _ = await start_up("--port", str(port))  # its port is free for the next one
        try:
            assert await served(address, "next") == "next-1"
        finally:
            code, rest = await stop(again)
        assert code == 0, rest
    finally:
        reap(parts)
        await asyncio.wait_for(proc.wait(), 10)  # killed: reaped on this loop


async def test_a_nats_that_dies_while_a_connection_drains_leaves_no_traceback(tmp_path, caplog, monkeypatch):
    """The race a killed `scaler up` may meet: a part stops, finds NATS there and drains its connection, and
    NATS dies meanwhile (killed with `scaler up`). nats-py's own drain timeout ends the drain, which then leaves
    nothing unread; ended from outside, it left the subscriptions' gathered drains failed and unread."""
    server = NatsServer(tmp_path / "nats")
    nc = await connect(await server.start(), "test")
    try:

        async def received(msg) -> None:
            pass

        for n in range(3):
            await nc.subscribe(f"s.{n}", cb=received)
        drain = Client.drain

        async def dying(self: Client) -> None:
            draining = asyncio.ensure_future(drain(self))
            await asyncio.sleep(0)  # the subscriptions' drains under way
            server.proc.kill()
            await draining

        monkeypatch.setattr(Client, "drain", dying)
        async with asyncio.timeout(30):  # a hang guard: the drain ends at nats-py's own timeout, DRAIN_S
            await close(nc)
        gc.collect()  # an exception never read is reported when its future goes
        assert "never retrieved" not in caplog.text, caplog.text
    finally:
        await server.stop(kill=True)


async def test_the_workers_stop_together_each_in_its_own_grace(nats_url, monkeypatch):
    """After a live run the platform is gone and both workers still have work under way: each gets its
    grace, at the same time, not one after the other: both have begun to stop before either grace ends."""
    monkeypatch.setattr(effects, "STOP_GRACE_S", 0.5)
    dead = f"127.0.0.1:{free_port()}"  # the simulator's platform, gone at the end of its run
    both = workers_main.make(workers_main.build_parser().parse_args(["--nats", nats_url, "--platform", dead]))
    await both.start()
    seen: list[str] = []

    async def platform_call(name: str) -> None:  # one that will not come back in time
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append(f"{name}'s grace ended")
            raise

    for worker in both.parts:
        worker.spawn(platform_call(worker.name))
        stop = worker.stop

        async def stopping(name: str = worker.name, stop=stop) -> None:
            seen.append(f"{name} stopping")
            await stop()

        monkeypatch.setattr(worker, "stop", stopping)
    await both.stop()
    names = [worker.name for worker in both.parts]
    assert len(names) == 2 and sorted(seen[:2]) == sorted(f"{n} stopping" for n in names), seen
    assert sorted(seen[2:]) == sorted(f"{n}'s grace ended" for n in names), seen


@pytest.mark.parametrize(
    ("args", "why", "then"),
    [
        (["--metas", "/nope"], "argument --metas: /nope: cannot read: No such file or directory", ""),
        (["--data-dir", "/etc/hostname/store"], "argument --data-dir: cannot use '/etc/hostname/store'", "Not a dir"),
    ],
)
def test_a_bad_path_is_refused_before_anything_starts(args, why, then):
    done = subprocess.run([sys.executable, "-m", "scaler", "up", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    said = done.stderr.splitlines()[-1]
    assert said.startswith("scaler up: error: ") and why in said and then in said, done.stderr
    assert "nats-server" not in done.stderr and "platform_stub" not in done.stderr and "Errno" not in done.stderr


async def test_a_metrics_port_in_use_is_named_as_the_metrics_port():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = await run_cli("up", "--port", "0", "--metrics-port", str(port), seconds=60)
    assert code == 1, err
    assert f"scaler up failed: node: cannot listen for metrics on 127.0.0.1:{port}: Address already in use" in err


def test_up_help_shows_the_defaults():
    done = subprocess.run([sys.executable, "-m", "scaler", "up", "--help"], capture_output=True, text=True)
    text = " ".join(done.stdout.split())  # as one line: argparse wraps at the terminal's width
    for option, default in [
        ("--port", "9001"),
        ("--speed", "1.0"),
        ("--retention-hours", "24.0"),
        ("--policy", "learned"),
    ]:
        assert re.search(rf"{option} .*?\(default: {re.escape(default)}\)", text), (option, done.stdout)
    assert text.count("(default: learned)") == 1 and "(default: None)" not in text


# --- a live run: its end said as such, and Ctrl-C keeps what was measured ---------------------------


@contextlib.asynccontextmanager
async def simulating(folder: Path):
    """`scaler simulate FOLDER` live against a `scaler up` of its own, both at speed 10, progress every 0.2 s."""
    platform = f"127.0.0.1:{free_port()}"
    proc, gateway, _ = await start_up("--platform", platform, "--speed", "10", "--policy", "demo")
    try:
        yield await simulate_cli(
            folder, "--gateway", gateway, "--platform-listen", platform, "--speed", "10", "--progress-every", "0.2"
        )
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest


@pytest.mark.live_trace
async def test_a_live_run_says_its_end_is_the_tail_after_the_last_idle(tmp_path):
    async with simulating(steady(tmp_path / "s", n=3)) as simulator:
        code, err = await finished(simulator, 60)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("progress: ")]
    tail = [line for line in lines if "the run's end, 20s after the last Idle:" in line]
    assert tail and all("3/3 requests" in line for line in tail), err  # 2 s of run at speed 10
    for line in lines:  # never trace time past the trace's end
        shown, span = re.search(r"trace (\S+) of (\S+),", line).groups() if "trace " in line else ("", "")
        assert shown <= span, line


@pytest.fixture
def ctrl_c_delivered():
    """A child inherits an ignored SIGINT, as every command a shell without job control starts in the
    background does (`nohup ... &`): Python then leaves Ctrl-C ignored. A terminal's Ctrl-C is what this
    test plays, so its children start with SIGINT handled."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


async def on_a_terminal(command: list[str], interrupt_when: Callable[[str], bool]) -> tuple[int, str]:
    """Run `command` with its stdout and stderr on a terminal, Ctrl-C once `interrupt_when(what it showed)`;
    its exit status and everything it showed."""
    parent, child = pty.openpty()
    proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    os.set_blocking(parent, False)
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(parent, readable.set)
    shown, sent = b"", False
    try:
        async with asyncio.timeout(120):
            while True:
                await readable.wait()
                readable.clear()
                try:
                    chunk = os.read(parent, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: every process holding the terminal is gone
                    break
                shown += chunk
                if not sent and interrupt_when(shown.decode(errors="replace")):
                    proc.send_signal(signal.SIGINT)
                    sent = True
            code = await proc.wait()
    finally:
        loop.remove_reader(parent)
        os.close(parent)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert sent, f"the run ended before it was interrupted:\n{shown.decode(errors='replace')}"
    return code, shown.decode(errors="replace").replace("\r\n", "\n")


def bar_count(text: str) -> int:
    """The requests done in the bar as last drawn."""
    found = re.findall(r"\r\[[#.]+\] (\d+)/", text)
    return int(found[-1]) if found else 0


@pytest.mark.live_trace
@pytest.mark.usefixtures("ctrl_c_delivered")
async def test_ctrl_c_on_a_live_run_gives_possible_statistics_of_the_requests_done_and_the_next_run_is_refused(
    tmp_path,
):
    # 100 requests 500 ms apart, each running 3 s: at the Ctrl-C several are under way, waiting or running.
    requests = [request(i * 500, "o", 3000) for i in range(100)]
    folder = write_dataset(tmp_path / "overlap", [meta("o", init=300)], requests)
    platform = f"127.0.0.1:{free_port()}"
    proc, gateway, _ = await start_up("--platform", platform, "--speed", "10", "--policy", "demo")
    try:
        command = [sys.executable, "-m", "scaler", "simulate", str(folder), "--gateway", gateway]
        command += ["--platform-listen", platform, "--speed", "10"]
        code, shown = await on_a_terminal(command, lambda text: bar_count(text) >= 5)
        again = await simulate_cli(folder, "--gateway", gateway, "--platform-listen", platform, "--speed", "10")
        code_again, err_again = await finished(again, 60)
    finally:
        code_up, rest = await stop(proc)
    assert code == 130, shown
    lines = shown.split("\n")
    (at,) = [n for n, line in enumerate(lines) if "PARTIAL" in line]
    heading = re.fullmatch(r"overlap: PARTIAL, interrupted after (\d+) of 100 requests \(live .*", lines[at])
    assert heading, lines[at - 1 : at + 1]  # a line of its own, the bar's ended before it
    done = int(heading.group(1))
    assert 5 <= done < 100 and done == bar_count(lines[at - 1]), lines[at - 1 : at + 1]
    figures = dict(re.findall(r"^  ([A-Za-z]+)\s+(-?[\d,.]+)$", shown, re.MULTILINE))
    figures = {name: float(value.replace(",", "")) for name, value in figures.items()}
    assert figures["totalRequestsCount"] == done, shown
    assert all(value >= 0 for value in figures.values()), figures
    assert figures["invocationExecutionTimeInGBs"] <= figures["totalSlotTimeInGBs"], figures
    assert figures["score"] <= 100, figures
    assert "scaler simulate: interrupted; the statistics above are partial" in shown
    # The scaler still holds what that run left: the next run is refused, in one line saying what to do.
    assert code_again == 1, err_again
    assert err_again.count("\n") == 1 and re.fullmatch(
        rf"scaler simulate: error: the scaler at {gateway} holds \d+ instances? of an earlier run, whose platform is"
        r" gone\. Each run needs .* stop that one and start a fresh `scaler up --platform HOST:\d+ --speed 10`.*\n",
        err_again,
    ), err_again
    assert code_up == 0, rest


# --- a store limit that fits the store (issue 22, item 10) ------------------------------------------


@pytest.fixture
async def small_nats(tmp_path):
    """A nats-server whose JetStream store holds 1 GB (compose's sim profile: a tmpfs of half the host's memory)."""
    port = free_port()
    config = tmp_path / "small.conf"
    config.write_text(f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {tmp_path / 'js'}, max_file_store: 1GB }}\n")
    server = await asyncio.create_subprocess_exec(server_binary(), "-c", str(config), stderr=asyncio.subprocess.DEVNULL)
    try:
        async with asyncio.timeout(15):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        await server.wait()


async def test_a_store_limit_the_nats_store_cannot_hold_is_one_line_naming_the_option(small_nats):
    code, err = await run_cli("up", "--port", "0", "--nats", small_nats, seconds=60)
    assert code == 1, err
    said = [line for line in err.splitlines() if "ERROR" in line]
    assert len(said) == 1, err
    assert "scaler up failed: node: nats-server cannot reserve the 10 GB store limit of EVENTS" in said[0]
    assert "--store-limit-gb (SCALER_STORE_LIMIT_GB)" in said[0]


async def test_workers_first_on_a_small_store_create_the_stream_with_the_limit_they_are_given(small_nats):
    command = [sys.executable, "-m", "scaler.workers", "--nats", small_nats, "--platform", f"127.0.0.1:{free_port()}"]
    workers = await asyncio.create_subprocess_exec(
        *command, env={**os.environ, "SCALER_STORE_LIMIT_GB": "0.5"}, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(30):
            while "ready:" not in (line := (await workers.stderr.readline()).decode()):
                assert line, "the workers exited before they were ready"
    finally:
        workers.terminate()
        await workers.communicate()
    proc, address, _ = await start_up("--nats", small_nats, "--store-limit-gb", "0.5")
    try:
        assert await served(address, "fits") == "fits-1"
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest


def test_under_sim_env_every_part_that_may_create_the_stream_asks_a_limit_its_tmpfs_holds():
    """sim.env puts NATS's store on a tmpfs: half the host's memory, of which JetStream takes 75 %. A host of
    8 GiB gives it 3 GiB; whichever part creates EVENTS first (a worker, in compose) must ask no more."""
    sim = compose.load(compose.read_env_file(compose.SIM_ENV))
    asked = {}
    for name, service in sim["services"].items():
        if compose.is_ours(service):
            args = compose.parse(name, service).args
            if hasattr(args, "store_limit_gb"):
                asked[name] = args.store_limit_gb
    assert set(asked) >= {"node", "platform-worker", "gc-worker"}, asked
    assert all(gb <= 3 * 2**30 / 10**9 for gb in asked.values()), asked


# --- metrics: the ready line means the endpoint listens; docs/operations.md lists what it serves ------


async def test_metrics_listen_at_the_ready_line_and_are_those_the_docs_list_snapshot_age_without_data_dir():
    proc, address, lines = await start_up("--metrics-port", "0")  # no --data-dir: a temporary store
    try:
        url = re.search(r"metrics (http://\S+/metrics)", lines[-1]).group(1)
        assert (await http_get(url))[0] == 200  # at once: the ready line comes once the endpoint listens
        assert await served(address, "snap") == "snap-1"
        families: set[str] = set()
        async with asyncio.timeout(30):  # the node snapshots a partition with new events within seconds
            while "scaler_snapshot_age_seconds" not in families:
                text = (await http_get(url))[1]
                families = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("scaler_")}
                families = {f for f in families if not f.endswith("_created")}  # the library's own timestamps
                await asyncio.sleep(0.2)
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
    page = OPERATIONS.read_text()
    documented = {name.removesuffix("_total") for name in re.findall(r"^\| `(scaler_\w+)` \|", page, re.MULTILINE)}
    assert families == documented
    row = next(line for line in page.splitlines() if line.startswith("| `scaler_snapshot_age_seconds`"))
    assert "without `--data-dir`" not in row.replace("with or without `--data-dir`", ""), row


def test_the_sim_profile_is_a_project_of_its_own_on_free_host_ports():
    """A simulation beside a default stack that is up must not share its nats, node or volumes (the node
    would keep its state against the emptied store), nor its host ports."""
    env = compose.read_env_file(compose.SIM_ENV)
    default, sim = compose.load(), compose.load(env)
    assert env.get("COMPOSE_PROJECT_NAME", default["name"]) != default["name"]
    for service in ("node", "nats"):
        for published in sim["services"][service]["ports"]:
            assert published.split(":")[-2] == "0", published  # the engine picks a free one
