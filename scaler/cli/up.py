"""`scaler up`: the whole scaler on one machine, each component in its own process.

Starts an embedded nats-server (unless --nats), the platform stub (unless --platform), then the
workers and the node (gRPC service + controller), with the same flags and SCALER_* variables a
multi-machine or compose deployment uses. Logs one line when all are ready; on SIGINT, SIGTERM
or SIGHUP stops the node first and NATS last.

A part that dies is started again with the same arguments (NATS on its port and store, the node
on its gRPC port), with one line in the log; one that keeps dying within seconds of its start
makes `scaler up` give up and exit 1. Every part dies with `scaler up`, however it ends
(scaler/runtime/lifeline.py), and holds the data dir's lock while it lives.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from scaler.controller import __main__ as controller_main
from scaler.runtime import durability, lifeline, service, storehealth
from scaler.runtime.bus import close, connect
from scaler.runtime.natsd import NatsServer, claim
from scaler.runtime.ports import nats_url, peer, port
from scaler.runtime.service import READY_FD, add_log_level, env, positive, setup_logging, stop_on_signals
from scaler.runtime.tasks import cancelled
from scaler.simulator.dataset import metas_argument
from scaler.workers import effects

log = logging.getLogger("scaler.up")

QUICK_S = 30.0  # a part that dies sooner than this after its start died quickly
GIVE_UP_AFTER = 5  # quick deaths in a row
BACKOFF_S = (0.0, 0.5, 1.0, 2.0)  # wait before the 1st, 2nd, ... restart in a row of quick deaths
MEND_EVERY_S = 1.0  # how often a store that had a write error is looked at for room to write again
MEND_FREE_BYTES = 1 << 30  # room enough: 1 GB free, or a quarter of a smaller disk


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", type=nats_url, help="use this NATS (with JetStream) instead of starting an embedded one")
    p.add_argument("--platform", type=peer, help="HOST:PORT of a real platform; the bundled stub is then not started")
    p.add_argument("--port", type=port, default=9001, help="gRPC port of the Scaler service (0: any free port)")
    p.add_argument(
        "--host",
        default=env("HOST", "127.0.0.1"),
        help="address the Scaler service and the metrics bind (0.0.0.0: every interface, which needs"
        " --admin-token-file) [SCALER_HOST]",
    )
    p.add_argument(
        "--data-dir",
        type=data_dir,
        help="where the embedded NATS keeps its store (DIR/nats: the events, leases and snapshots); default: a"
        " temporary folder, removed at exit",
    )
    p.add_argument("--metas", type=metas_argument, help="the stub's init times: a dataset folder or its metas file")
    p.add_argument(
        "--metrics-port",
        type=port,
        metavar="N",
        help="the node serves Prometheus metrics on http://HOST:N/metrics (0: any free port; default: none)",
    )
    controller_main.add_options(p)  # the node's: policy, replicas, limits, overload, retention
    p.add_argument("--speed", type=positive, default=1.0, help="run every clock N times faster (for simulations)")
    add_log_level(p, "INFO", "this command's log level; components log warnings")
    p.add_argument(
        "--admin-token-file",
        default=env("ADMIN_TOKEN_FILE", ""),
        metavar="PATH",
        help="the key Admin calls must carry (a random one is made if the file does not exist); needed with a --host"
        " beyond loopback [SCALER_ADMIN_TOKEN_FILE]",
    )
    service.add_server_tls(p, "the Scaler service")
    service.add_client_tls(p, "platform", "PLATFORM", "the platform (--platform)")
    service.add_nats_access(p)  # for --nats


SECURITY_FLAGS = (  # passed on to the node as given: (dest, flag)
    ("admin_token_file", "--admin-token-file"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("tls_client_ca", "--tls-client-ca"),
)
PLATFORM_TLS_FLAGS = (
    ("platform_ca", "--platform-ca"),
    ("platform_cert", "--platform-cert"),
    ("platform_key", "--platform-key"),
)
FROM_FLAGS = (
    "TLS_CERT",
    "TLS_KEY",
    "TLS_CLIENT_CA",
    "ADMIN_TOKEN_FILE",
    "PLATFORM_CA",
    "PLATFORM_CERT",
    "PLATFORM_KEY",
)


def given(a: argparse.Namespace, flags: tuple[tuple[str, str], ...]) -> list[str]:
    """The flags among `flags` that have a value, with it, to pass on to a part."""
    return [arg for dest, flag in flags if getattr(a, dest, "") for arg in (flag, getattr(a, dest))]


def data_dir(text: str) -> str:
    """An argparse type: a folder for the store, made if missing; refused in one line if it cannot be."""
    try:
        Path(text).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot use {text!r} as the store's folder: {e.strerror}") from None
    return text


@dataclass
class Child:
    """A running part: how to start it (again), and the process it is now."""

    name: str
    proc: asyncio.subprocess.Process
    address: str = ""
    addresses: list[str] = field(default_factory=list)  # where it listens: gRPC first, then metrics
    launch: Callable[[], Awaitable[None]] | None = None  # starts it again in place (sets proc, address)
    ready_at: float = 0.0
    quick_deaths: int = 0
    planned: str = ""  # set when it is stopped on purpose, to be started again: said instead of a death


class StartFailed(RuntimeError):
    """A part exited before it was ready; the message is its own word on why, when it said one."""


@dataclass
class Supervisor:
    args: argparse.Namespace
    env: dict[str, str] = field(default_factory=dict)  # given to every child
    children: list[Child] = field(default_factory=list)
    nats: NatsServer | None = None
    _tmp: str | None = None
    _claim: object = None  # the data dir's lock: held here and by every child
    _store_error: str = ""  # the embedded nats-server's word on a write error of its store, until it is restarted

    @property
    def _keep_fds(self) -> tuple[int, ...]:
        return (self._claim.fileno(),) if self._claim is not None else ()

    async def spawn(self, module: str, *argv: str, name: str = "", env_extra: dict[str, str] | None = None) -> Child:
        """Start `python -m module *argv` (with `env_extra` in its environment) and wait for its ready line."""
        child = Child(name or module, proc=None)  # type: ignore[arg-type]

        async def launch() -> None:
            await self._start(module, argv, child, env_extra or {})

        child.launch = launch
        self.children.append(child)
        await launch()
        return child

    async def _start(self, module: str, argv: tuple[str, ...], child: Child, env_extra: dict[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        child_env = {**os.environ, **self.env, **env_extra, READY_FD: str(write_fd)}
        try:
            proc = await asyncio.create_subprocess_exec(
                *lifeline.command(os.getpid(), sys.executable, "-m", module, *argv),
                env=child_env,
                pass_fds=(write_fd, *self._keep_fds),
                start_new_session=True,  # a Ctrl-C on the terminal is ours to pass on, in order
            )
        finally:
            os.close(write_fd)
        child.proc = proc  # stop() reaches it even while we wait for it
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
        )
        try:
            line = await reader.readline()
        finally:
            transport.close()
        said = json.loads(line) if line else {}
        if "address" not in said:
            code = await proc.wait()
            raise StartFailed(said.get("error") or f"{_exit(code)} before it was ready")
        child.address, child.addresses = said["address"], said.get("addresses", [])
        child.ready_at = asyncio.get_running_loop().time()

    async def start(self) -> str:
        a = self.args
        if a.data_dir:
            self._claim = claim(a.data_dir)  # its store is this run's alone
        if a.nats:
            url = a.nats
            access = service.nats_access(a, "node")
            nc = await connect(access, "scaler up")  # said once, here, rather than by every part
            replicas = a.replicas or durability.default_replicas(nc)
            await close(nc)
        else:
            url = await self._start_nats(Path(a.data_dir) if a.data_dir else None)
            replicas = a.replicas or 1
        self.env = {"SCALER_NATS_URL": url, "SCALER_SPEED": str(a.speed), "SCALER_LOG_LEVEL": "WARNING"}
        self.env |= {f"SCALER_{var}": getattr(a, dest) or "" for dest, var in service.NATS_ACCESS_VARS.items()}
        self.env |= {f"SCALER_{v}": "" for v in FROM_FLAGS}  # a part gets these as flags, from this command's own
        platform = a.platform
        if not platform:
            stub_args = ["--listen", "127.0.0.1:0"] + (["--metas", a.metas] if a.metas else [])
            stub = await self._part("platform stub", "scaler.platform_stub", *stub_args)
            platform = stub.address
            stub.launch = self._same_port(stub, "scaler.platform_stub", stub_args)
        metrics = ["--metrics-port", str(a.metrics_port)] if a.metrics_port is not None else []
        monitor = self.nats.monitor_url if self.nats else a.nats_monitor
        node_args = ["node", "--listen", f"{a.host}:{a.port}", "--policy", a.policy, "--replicas", str(replicas)]
        node_args += ["--nats-monitor", monitor] if monitor else []
        node_args += ["--node-dir", str(Path(a.data_dir) / "node")] if a.data_dir else []  # a name kept: see node.py
        node_args += ["--nats-unsynced"] if a.nats_unsynced else []
        node_args += ["--max-behind", str(a.max_behind), "--store-wait", str(a.store_wait), *metrics]
        node_args += ["--limits", a.limits] if a.limits else []
        node_args += ["--session-idle", str(a.session_idle)] if a.session_idle is not None else []
        node_args += ["--exchange-rate", str(a.exchange_rate)] if a.exchange_rate is not None else []
        node_args += [arg for name, value in controller_main.knobs_of(a) for arg in ("--knob", f"{name}={value}")]
        node_args += ["--retention-hours", str(a.retention_hours), "--store-limit-gb", str(a.store_limit_gb)]
        node_args += given(a, SECURITY_FLAGS)
        node = await self._part("node", "scaler", *node_args)
        node.launch = self._same_port(node, "scaler", node_args)
        # the gc worker reconciles in the background
        platform_tls = given(a, PLATFORM_TLS_FLAGS) if a.platform else []  # the bundled stub serves in clear
        await self._part("workers", "scaler.workers", "--platform", platform, *platform_tls)
        metrics_url = f"http://{node.addresses[1]}/metrics" if metrics else ""
        stub_note = "" if a.platform else " (bundled stub)"
        nats = f"{url} (embedded, store {self.nats.store_dir})" if self.nats else url
        metrics_note = f", metrics {metrics_url}" if metrics else ""
        sync = await durability.server_sync(durability.monitor_urls(url, monitor))  # the node warns, if need be
        return (
            f"scaler ready: gRPC {node.address}, policy {a.policy}, platform {platform}{stub_note}, nats {nats}"
            f" ({durability.describe(sync, replicas)}){metrics_note}"
        )

    async def _part(self, name: str, module: str, *argv: str) -> Child:
        try:
            return await self.spawn(module, *argv, name=name)
        except StartFailed as e:
            raise StartFailed(f"{name}: {e}") from None

    def _same_port(self, child: Child, module: str, argv: list[str]) -> Callable[[], Awaitable[None]]:
        """A restart listens where the first start did (it may have been told port 0), metrics included."""
        argv = list(argv)
        at = argv.index("--listen") + 1
        argv[at] = f"{argv[at].rsplit(':', 1)[0]}:{child.address.rsplit(':', 1)[1]}"
        if "--metrics-port" in argv:
            argv[argv.index("--metrics-port") + 1] = child.addresses[1].rsplit(":", 1)[1]

        async def launch() -> None:
            await self._start(module, tuple(argv), child, {})

        return launch

    async def _start_nats(self, data_dir: Path | None) -> str:
        store = data_dir if data_dir else Path(self._make_tmp())
        wrap = lifeline.command(os.getpid(), remove=self._tmp or "")
        self.nats = NatsServer(store / "nats", wrap=tuple(wrap), pass_fds=self._keep_fds, heard=self._heard)
        child = Child("nats-server", proc=None)  # type: ignore[arg-type]
        self.children.append(child)

        async def launch() -> None:
            try:
                await self.nats.start()
            finally:
                child.proc = self.nats.proc
            child.address = self.nats.url
            child.ready_at = asyncio.get_running_loop().time()

        child.launch = launch
        await launch()
        return self.nats.url

    def _heard(self, level: int, text: str) -> None:
        """nats-server's own log: a write error of its store (a full disk) is noted, for `_mend_store`."""
        if level >= logging.ERROR and storehealth.breaks_stream(text) and not self._store_error:
            self._store_error = text

    async def _mend_store(self, nats: Child) -> None:
        """Restart the embedded nats-server once its store had a write error and there is room again: a stream
        that had one takes no write until its server restarts (scaler/runtime/storehealth.py)."""
        assert self.nats is not None
        waiting_said = False
        while True:
            await asyncio.sleep(MEND_EVERY_S)
            if not self._store_error or nats.planned:
                continue
            disk = shutil.disk_usage(self.nats.store_dir)
            need = min(MEND_FREE_BYTES, disk.total // 4)
            if disk.free < need:
                if not waiting_said:
                    log.error(
                        "the store's disk is full (%s free of %s in %s): the scaler answers no call that must be"
                        " stored; free space there (%s at least) and nats-server is restarted",
                        _mb(disk.free), _mb(disk.total), self.nats.store_dir, _mb(need),
                    )  # fmt: skip
                    waiting_said = True
                continue
            nats.planned = (
                f"nats-server's store had a write error ({self._store_error}); {_mb(disk.free)} free again:"
                " nats-server restarted, as a stream that had one takes no write until then"
            )
            self._store_error, waiting_said = "", False
            await self.nats.stop()  # its keeper starts it again

    def _make_tmp(self) -> str:
        self._tmp = tempfile.mkdtemp(prefix="scaler-")
        return self._tmp

    async def watch(self, stop: asyncio.Event) -> int:
        """Until a stop signal (exit 0), start again any part that dies; give up (exit 1) on one that keeps dying."""
        keepers = [asyncio.create_task(self._keep(c)) for c in self.children]
        nats = next((c for c in self.children if self.nats is not None and c.name == "nats-server"), None)
        menders = [asyncio.create_task(self._mend_store(nats))] if nats is not None else []
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopping, *keepers], return_when=asyncio.FIRST_COMPLETED)
        await cancelled(stopping, *keepers, *menders)
        return 0 if stopping in done else 1

    async def _keep(self, child: Child) -> None:
        """Start `child` again each time it dies; return when it died GIVE_UP_AFTER times quickly in a row."""
        loop = asyncio.get_running_loop()
        while True:
            code = await child.proc.wait()
            why = _exit(code)
            if child.planned:  # stopped on purpose: started again at once, not counted as a death
                log.warning("%s", child.planned)
                child.planned, child.ready_at = "", loop.time()
                try:
                    await child.launch()
                    continue
                except (StartFailed, RuntimeError) as e:
                    why = f"did not start again ({e})"
            while True:
                quick = loop.time() - child.ready_at < QUICK_S
                child.quick_deaths = child.quick_deaths + 1 if quick else 1
                if child.quick_deaths >= GIVE_UP_AFTER:
                    log.error(
                        "%s %s, its %s death in a row within %gs of its start; giving up",
                        child.name, why, _nth(child.quick_deaths), QUICK_S,
                    )  # fmt: skip
                    return
                delay = BACKOFF_S[min(child.quick_deaths, len(BACKOFF_S)) - 1]
                later = f" in {delay:g}s" if delay else ""
                log.warning("%s %s; starting it again%s", child.name, why, later)
                await asyncio.sleep(delay)
                child.ready_at = loop.time()
                try:
                    await child.launch()
                    break
                except (StartFailed, RuntimeError) as e:
                    why = f"did not start again ({e})"

    async def stop(self) -> None:
        """The node first (no new calls), then the rest together, NATS last."""
        nats = [c for c in self.children if self.nats is not None and c.name == "nats-server"]
        first = [c for c in self.children if c.name == "node"]
        rest = [c for c in self.children if c not in first and c not in nats]
        for group in (first, rest):
            await self._stop_group(group)
        self.children.clear()
        if self.nats is not None:
            log.info("stopping nats-server")
            await self.nats.stop()
        if self._claim is not None:
            self._claim.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    async def _stop_group(self, group: list[Child]) -> None:
        """Stop them together, saying what is waited for (the workers give work under way a grace)."""
        alive = [c for c in group if c.proc is not None and c.proc.returncode is None]
        if not alive:
            return
        workers = any(c.name == "workers" for c in alive)
        grace = f" (work under way gets up to {effects.STOP_GRACE_S:g}s)" if workers else ""
        log.info("stopping %s%s", ", ".join(c.name for c in alive), grace)
        await asyncio.gather(*(self._terminate(c) for c in alive))

    @staticmethod
    async def _terminate(child: Child) -> None:
        if child.proc is None or child.proc.returncode is not None:
            return
        child.proc.terminate()
        try:
            await asyncio.wait_for(child.proc.wait(), 10)
        except TimeoutError:
            log.warning("%s did not stop in 10s; killing it", child.name)
            child.proc.kill()
            await child.proc.wait()


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def _exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _stop_signals() -> asyncio.Event:
    """SIGINT and SIGTERM, and SIGHUP (the terminal closed) unless it is ignored (nohup)."""
    stop = stop_on_signals()
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, stop.set)
    return stop


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    controller_main.policy_of(args)  # its settings refused before anything starts

    async def main() -> int:
        stop = _stop_signals()
        supervisor = Supervisor(args)
        try:
            starting = asyncio.create_task(supervisor.start())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                stopping.cancel()
                log.info(starting.result())
                code = await supervisor.watch(stop)
            else:  # a signal during the start: stop what was started
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                code = 0
        except Exception as e:
            log.error("scaler up failed: %s", e)
            code = 1
        finally:
            await supervisor.stop()
        log.info("scaler stopped")
        return code

    return asyncio.run(main())
