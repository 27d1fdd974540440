"""`scaler up`: the whole scaler on one machine, each component in its own process.

Starts an embedded nats-server (unless --nats), the platform stub (unless --platform), then the
workers and the node (gRPC service + controller), with the same flags and SCALER_* variables a
multi-machine or compose deployment uses. Logs one line when all are ready; on SIGINT/SIGTERM
stops the node first and NATS last. If any part dies, everything stops with an error.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from controller.core.policy import DEFAULT_POLICY, POLICIES
from runtime.natsd import NatsServer, claim
from runtime.service import READY_FD, env, setup_logging, stop_on_signals

log = logging.getLogger("scaler.up")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", help="use this NATS (with JetStream) instead of starting an embedded one")
    p.add_argument("--platform", help="HOST:PORT of a real platform; the bundled stub is then not started")
    p.add_argument("--port", type=int, default=9001, help="gRPC port of the Scaler service (0: any free port)")
    p.add_argument(
        "--host",
        default=env("HOST", "0.0.0.0"),
        help="address the Scaler service binds (127.0.0.1: this machine only) [SCALER_HOST]",
    )
    p.add_argument(
        "--data-dir",
        help="where the embedded NATS keeps its store (DIR/nats: the events, leases and snapshots); default: a"
        " temporary folder, removed at exit",
    )
    p.add_argument("--metas", help="the stub's init times: a dataset folder or its metas file")
    p.add_argument("--policy", default=env("POLICY", DEFAULT_POLICY), choices=sorted(POLICIES))
    p.add_argument("--speed", type=float, default=1.0, help="run every clock N times faster (for simulations)")
    p.add_argument("--log-level", default="INFO", help="this command's log level; components log warnings")


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    address: str = ""


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.env: dict[str, str] = {}  # given to every child
        self.children: list[Child] = []
        self.nats: NatsServer | None = None
        self._tmp: str | None = None
        self._claim = None  # the data dir's lock, held while running

    async def spawn(self, module: str, *argv: str, name: str = "", env_extra: dict[str, str] | None = None) -> Child:
        """Start `python -m module *argv` and wait for its ready line."""
        read_fd, write_fd = os.pipe()
        child_env = {**os.environ, **self.env, **(env_extra or {}), READY_FD: str(write_fd)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *argv, env=child_env, pass_fds=(write_fd,), start_new_session=True
        )
        os.close(write_fd)
        child = Child(name or module, proc)
        self.children.append(child)
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
        )
        try:
            line = await reader.readline()
        finally:
            transport.close()
        if not line:
            code = await proc.wait()
            raise RuntimeError(f"{module} exited with code {code} before it was ready")
        child.address = json.loads(line).get("address", "")
        return child

    async def start(self) -> str:
        a = self.args
        if a.data_dir:
            self._claim = claim(a.data_dir)  # its store is this run's alone
        if a.nats:
            url = a.nats
        else:
            store = Path(a.data_dir) if a.data_dir else Path(self._make_tmp())
            self.nats = NatsServer(store / "nats")
            url = await self.nats.start()
        self.env = {"SCALER_NATS_URL": url, "SCALER_SPEED": str(a.speed), "SCALER_LOG_LEVEL": "WARNING"}
        platform = a.platform
        if not platform:
            stub_args = ["--listen", "127.0.0.1:0"] + (["--metas", a.metas] if a.metas else [])
            platform = (await self.spawn("platform_stub", *stub_args)).address
        listen = f"{a.host}:{a.port}"
        node = await self.spawn("scaler", "node", "--listen", listen, "--policy", a.policy, name="node")
        await self.spawn("workers", "--platform", platform)  # the gc worker reconciles with the node on start
        stub = "" if a.platform else " (bundled stub)"
        nats = f"{url} (embedded, store {self.nats.store_dir})" if self.nats else url
        return f"scaler ready: gRPC {node.address}, policy {a.policy}, platform {platform}{stub}, nats {nats}"

    def _make_tmp(self) -> str:
        self._tmp = tempfile.mkdtemp(prefix="scaler-")
        return self._tmp

    async def watch(self, stop: asyncio.Event) -> int:
        """Wait for a stop signal (exit 0) or for any child to die (exit 1)."""
        waits = {asyncio.create_task(c.proc.wait()): c for c in self.children}
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopping, *waits], return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        if stopping in done:
            return 0
        stopping.cancel()
        dead = next(waits[t] for t in done)
        log.error("%s exited with code %s; stopping everything", dead.name, dead.proc.returncode)
        return 1

    async def stop(self) -> None:
        """The node first (no new calls), then the rest together, NATS last."""
        first = [c for c in self.children if c.name == "node"]
        for group in (first, [c for c in self.children if c not in first]):
            await asyncio.gather(*(self._terminate(c) for c in group))
        self.children.clear()
        if self.nats is not None:
            await self.nats.stop()
        if self._claim is not None:
            self._claim.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    async def _terminate(child: Child) -> None:
        if child.proc.returncode is not None:
            return
        child.proc.terminate()
        try:
            await asyncio.wait_for(child.proc.wait(), 10)
        except TimeoutError:
            log.warning("%s did not stop in 10s; killing it", child.name)
            child.proc.kill()
            await child.proc.wait()


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)

    async def main() -> int:
        stop = stop_on_signals()
        supervisor = Supervisor(args)
        try:
            log.info(await supervisor.start())
            code = await supervisor.watch(stop)
        except Exception as e:
            log.error("scaler up failed: %s", e)
            code = 1
        finally:
            await supervisor.stop()
        log.info("scaler stopped")
        return code

    return asyncio.run(main())
