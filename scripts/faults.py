"""The fault suite: each fault done to a scaler serving real callers, then the same checks, printed as a table.

    .venv/bin/python scripts/faults.py                 # every fault, the worst ones several times (about 35 minutes)
    .venv/bin/python scripts/faults.py pause torn      # some of them
    .venv/bin/python scripts/faults.py --once          # every fault once

Real processes throughout: nats-server (syncing every write), the nodes and workers as `scaler up` runs
them (tests/processes.py), gRPC callers that repeat a refused call with the same request id, as a
platform does, and the platform stub in the mode of the challenge's platform (a new slot per
CreateSlot, a second Init refused, no list of its slots). The faults:
- pause: two nodes serving, one stopped (SIGSTOP) past its lease, then woken;
- leader: a cluster of three servers, the server leading the EVENTS stream killed (kill -9), restarted;
- lost tail: an older copy of the NATS store put under a running node (its last batches lost);
- idle then crash: the node's link to NATS cut under callers (Idles answered, their releases never stored),
  the node killed -9 and started again: the instances of the lost releases retired after the timeout;
- upgrade: a node started on a store an earlier version wrote (tests/fixtures/upgrade), retention having
  emptied its stream, then serving;
- torn: a node stopped, one partition's snapshot cut short, the node started again;
- crash-loop: the node killed -9 and started again at once under its name, ten times (time to serve again each);
- full-disk: `scaler up`'s store on a 32 MB filesystem (tmpfs: run as root) filled, held full, freed: the
  refusals name the cause, the metric and /healthz say it, and nats-server is restarted once space is back;
- stalled-nats: nats-server stopped (SIGSTOP) under callers with 10 s deadlines, then woken: every call
  refused within 3 s rather than held to its deadline;
- skew, skew-far-behind, skew-ahead, skew-near-ahead: a node's wall clock 120 s behind (600 s behind, 600 s
  ahead, 120 s ahead: libfaketime, Debian's `faketime`) killed while its requests are held; the node taking
  over must not release them as timed out;
- failing-platform: Init, then CreateSlot, failing 15 s under warm callers and callers of new functions;
- stall-5, stall-12, stall-20: nats-server stopped (SIGSTOP) 5, 12 or 20 s and woken, ten times, under two nodes
  (every stall past the leases is a loss and a reload): service back within 10 s of each waking, and a fresh
  node loads the store afterwards;
- partition: node-1 cut off from NATS 12 s while node takes its partitions over, what node-1 sent meanwhile held
  and delivered once the link is mended (as TCP does): no stale decision stored over the new owner's;
- stream-deleted: the EVENTS stream deleted under a running node: made again, served again, /healthz unhealthy
  meanwhile, the slots the node held destroyed;
- retention-cut: EVENTS's limits cut to 5 s and 50 batches behind the node's back: put back, what was dropped held
  by snapshots, and a fresh node loads every partition;
- slow-init: Init taking 5-30 s under callers with 15 s deadlines: every call refused by the scaler in time.
- power-loss, power-loss-node-files, power-loss-cluster-1/2/3: nats-server's store on a disk that loses what was not
  synced (tests/powercut.py, LazyFS's model on FUSE 3), its power cut mid-burst (with the node's name and lock on it;
  one, two, all three servers of an R3 cluster) and restarted: every Assign answered before the cut in the stream;
- worker-killed, worker-killed-listing: the platform worker killed -9 as the platform answers Init (and CreateSlot,
  on a platform that lists its slots): no slot made twice for a request, no second Init on a slot, and where the
  platform lists its slots, no instance initialised twice.
The suite installs what it needs when run as root (Debian's fuse3 and faketime), else says in one line how.
The pause runs ten times in a row (a race may pass once; `--once` runs each fault once). Each run ends with the
same checks: no request assigned twice (in the stored log), no instance held by two requests at once (as the
callers saw it), replay equal to the running state (`scaler replay --verify`), no slot leaked (the platform's
live slots are exactly the state's), and every snapshot holding exactly the batches it claims; the faults that
break the store also start a fresh node on it. It exits 1 if any check failed.
"""

import argparse
import asyncio
import contextlib
import errno
import glob
import importlib.util
import io
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler import replay  # noqa: E402
from scaler.controller.core.state import LEASE_GRACE_MS, Phase  # noqa: E402
from scaler.controller.leases import holders  # noqa: E402
from scaler.platform_stub.server import MODES, PlatformStub  # noqa: E402
from scaler.proto.events import Assigned, Released  # noqa: E402
from scaler.proto.subjects import EVENTS, PARTITIONS, partition  # noqa: E402
from scaler.replay import explain  # noqa: E402
from scaler.runtime.bus import connected  # noqa: E402
from scaler.runtime.durability import monitor_get  # noqa: E402
from scaler.runtime.natsd import NatsCluster, NatsServer  # noqa: E402
from scaler.runtime.ports import free_port  # noqa: E402
from scaler.simulator.dataset import FunctionMeta  # noqa: E402
from scaler.store import stream  # noqa: E402
from tests.invariants import Assignments, snapshots_hold_what_they_claim  # noqa: E402
from tests.nemesis import Link, tear_snapshot  # noqa: E402
from tests.powercut import NoFuse, PowerCutDisk, apt_install  # noqa: E402
from tests.processes import Call, Driver, Parts, controller_state, settled, slots_of  # noqa: E402

KEYS = tuple(f"fn{n}" for n in range(12))
FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"


@dataclass
class Row:
    fault: str
    broke: str = ""
    calls: int = 0
    failed: int = 0
    repeated: int = 0  # calls a caller repeated (same request id) while the scaler was unavailable
    recovered_s: float | None = None  # from the fault to the first call answered after it
    twice: int = 0
    overlaps: int = 0
    replay_equal: bool = False
    leaked: int | None = None
    snapshots_ok: bool = False
    notes: list[str] = field(default_factory=list)
    excused: Callable[[Call, float], bool] = field(default=lambda call, fault_at: False)  # failed by the fault itself
    failed_by_fault: int = 0
    unmet: list[str] = field(default_factory=list)  # the fault's own checks that did not hold
    acknowledged: "Acknowledged | None" = None  # a power loss's: Assigns answered before the cut, found after it

    @property
    def passed(self) -> bool:
        held = not (self.failed or self.twice or self.overlaps or self.leaked or self.unmet)
        return held and self.replay_equal and self.snapshots_ok


async def finish(
    row: Row, nats_url: str, stub: PlatformStub, drivers: list[Driver], fault_at: float, settle_s: float = 60
) -> Row:
    """Stop the callers and make every check."""
    for d in drivers:
        d.stop()
    calls = [c for d in drivers for c in d.calls]
    failed = [c for c in calls if c.error and not row.excused(c, fault_at)]
    row.calls, row.failed = len(calls), len(failed)
    row.notes += sorted({c.error for c in failed})[:3]
    row.failed_by_fault = sum(1 for c in calls if c.error) - len(failed)
    if row.failed_by_fault:
        row.notes.append(f"{row.failed_by_fault} failed as the fault must make them: {row.excused.__doc__}")
    row.repeated = sum(c.retries for c in calls)
    after = [c.got_at for c in calls if c.got_at > fault_at]
    row.recovered_s = min(after) - fault_at if after else None
    row.overlaps = sum(len(d.overlaps()) for d in drivers)
    try:
        states = await settled(nats_url, stub, seconds=settle_s)
        row.leaked = len(set(stub.accounting.live) - {i.slot_id for s in states.values() for i in s.instances.values()})
    except AssertionError as e:  # not settled in time: what kept them apart
        row.leaked = len(stub.accounting.live)
        row.notes.append(str(e))
    async with connected(nats_url, "faults") as nc:
        js = nc.jetstream()
        assignments = Assignments()
        await replay.replay(nc, seen=assignments)
        row.twice = len(set(assignments.twice))
        out = io.StringIO()
        row.replay_equal = await replay.verify(nc, None, out) == 0
        if not row.replay_equal:
            row.notes.append(out.getvalue().strip().splitlines()[-1])
        breaches = await snapshots_hold_what_they_claim(js)
        row.snapshots_ok = not breaches
        row.notes += breaches[:3]
    return row


def callers(parts: Parts, tag: str = "") -> list[Driver]:
    return [Driver(parts.address(n), keys=KEYS, clients=6, tag=f"{tag}{n}-", retry_assign=True) for n in parts.nodes]


async def running(drivers: list[Driver], calls: int = 30, seconds: float = 60) -> None:
    """Wait until each caller had `calls` more calls answered."""
    start = [sum(1 for c in d.calls if c.got_at) for d in drivers]
    async with asyncio.timeout(seconds):
        while True:
            if all(sum(1 for c in d.calls if c.got_at) - s >= calls for d, s in zip(drivers, start, strict=True)):
                return
            await asyncio.sleep(0.1)


async def served(drivers: list[Driver], keys: tuple[str, ...], times: int = 3, seconds: float = 60) -> None:
    """Wait until each function of `keys` had `times` calls answered: it has instances and a history."""
    async with asyncio.timeout(seconds):
        while True:
            got = Counter(c.key for d in drivers for c in d.calls if c.got_at)
            if all(got[k] >= times for k in keys):
                return
            await asyncio.sleep(0.1)


async def spread(nats_url: str, nodes: int, seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while True:
            try:
                async with connected(nats_url, "faults") as nc:
                    held = Counter((await holders(nc.jetstream())).values())
                if len(held) == nodes and sum(held.values()) == PARTITIONS:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.2)


async def pause(tmp: Path, stub: PlatformStub) -> Row:
    row = Row("pause", "two nodes serving; one SIGSTOPped 12 s (lease 4 s), then woken")
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}", nodes=2) as parts:
        await spread(nats.url, 2)
        drivers = callers(parts)
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        pid = parts.running["node-1"].proc.pid
        os.kill(pid, signal.SIGSTOP)
        fault_at = time.monotonic()
        await asyncio.sleep(12)
        os.kill(pid, signal.SIGCONT)
        await spread(nats.url, 2)
        await running(drivers)
        await finish(row, nats.url, stub, drivers, fault_at)
        await asyncio.gather(*loads)
    return row


async def leader(tmp: Path, stub: PlatformStub) -> Row:
    row = Row("leader", "3-server cluster, R3, synced writes; the EVENTS leader's server kill -9, restarted 5 s later")
    async with NatsCluster(tmp / "cluster") as cluster:
        async with Parts(cluster.url, f"127.0.0.1:{stub.port}", nodes=2, replicas=3) as parts:
            await spread(cluster.url, 2)
            drivers = callers(parts)
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            async with connected(cluster.url, "faults") as nc:
                name = (await nc.jetstream().stream_info(EVENTS)).cluster.leader
            server = next(s for s in cluster.servers if s.name == name)
            await server.stop(kill=True)
            fault_at = time.monotonic()
            row.broke += f" ({name})"
            await asyncio.sleep(5)
            await server.start()
            await running(drivers)
            await finish(row, cluster.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
    return row


def idle_of_a_lost_assignment(call: Call, fault_at: float) -> bool:
    """the Idle of a request assigned before the store lost the batch that held its assignment"""
    lost = call.error.startswith(("NOT_FOUND: no instance", "FAILED_PRECONDITION: instance"))
    return lost and 0 < call.got_at < fault_at


async def lost_tail(tmp: Path, stub: PlatformStub) -> Row:
    """Against a platform that lists its slots: the slots made for the lost tail's instances can be found only
    by listing them (on one that cannot list, nothing names them: they leak, and the run says how many)."""
    row = Row("lost tail", "an older copy of the NATS store put under a running node (its last batches lost)")
    row.excused = idle_of_a_lost_assignment
    store = tmp / "nats"
    nats = NatsServer(store)
    await nats.start()
    try:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
            drivers = callers(parts, "a")
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            await nats.stop()
            shutil.copytree(store, tmp / "older")
            await nats.start()
            await running(drivers)  # the tail to be lost
            await nats.stop()
            shutil.rmtree(store)
            shutil.copytree(tmp / "older", store)
            await nats.start()
            fault_at = time.monotonic()
            await running(drivers, seconds=120)
            # The lost tail's slots are young: the gc worker's next round (every 60 s) retires them.
            await finish(row, nats.url, stub, drivers, fault_at, settle_s=150)
            await asyncio.gather(*loads)
            row.notes.append("requests of the lost tail are gone from the log: a repeat of one is served anew")
    finally:
        await nats.stop()
    return row


async def idle_then_crash(tmp: Path, stub: PlatformStub, timeout_s: int = 8) -> Row:
    """The node's link to NATS cut under callers, so that the Idles it answers meanwhile (at once, their
    releases stored right behind) reach no store; then the node killed -9, the link mended, the node started
    again. Each instance whose release was lost is still held in the rebuilt state: never handed out again,
    retired once its request is older than the functions' timeout (`timeout_s`) and its grace, its slot destroyed."""
    row = Row("idle then crash", "the node's link to NATS cut 2 s (Idles answered, not stored), the node kill -9")
    async with NatsServer(tmp / "nats") as nats, Link("127.0.0.1", nats.port) as link:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=("--nats", link.url)) as parts:
            drivers = [
                Driver(
                    parts.gateway,
                    keys=KEYS,
                    clients=6,
                    tag="i-",
                    retry_assign=True,
                    attempts=120,
                    function_timeout_s=timeout_s,
                )
            ]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            link.cut = True
            fault_at = time.monotonic()
            await asyncio.sleep(2)
            answered = [c for d in drivers for c in d.calls if c.idle_at > fault_at and not c.error]
            await parts.kill("node")
            link.cut = False
            await parts.start("node")
            await running(drivers)
            await finish(row, nats.url, stub, drivers, fault_at, settle_s=60 + timeout_s)
            await asyncio.gather(*loads)
            # Their requests past the timeout and its grace (LEASE_GRACE_MS): the instances retired, slots destroyed.
            lost, by = {c.request_id for c in answered}, time.monotonic() + timeout_s + LEASE_GRACE_MS / 1000 + 20
            while True:
                states = await settled(nats.url, stub)
                still = [i.id for s in states.values() for i in s.instances.values() if i.busy and i.request_id in lost]
                if not still or time.monotonic() > by:
                    break
                await asyncio.sleep(2)
    row.notes.append(f"{len(answered)} Idles sent while the link was cut: their releases never stored")
    if still:
        row.unmet.append(f"held by a released request past its timeout: {', '.join(sorted(still))}")
    return row


async def upgrade(tmp: Path, stub: PlatformStub) -> Row:
    release = sorted(FIXTURES.glob("store-*.tar.gz"))[0]
    row = Row("upgrade", f"a node started on {release.name} (an earlier version's store, its stream emptied)")
    with tarfile.open(release) as tar:
        tar.extractall(tmp, filter="data")
    async with NatsServer(tmp / "nats") as nats:
        fault_at = time.monotonic()
        async with Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
            drivers = callers(parts)
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            await finish(row, nats.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
    row.notes.append("the fixture's slots were never on this platform: their instances are dropped by keep-alive")
    return row


async def torn(tmp: Path, stub: PlatformStub) -> Row:
    row = Row("torn", "a node stopped, the snapshot of fn0's partition cut short, the node started again")
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        drivers = callers(parts)
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        await parts.supervisor._terminate(parts.running["node"])  # a clean stop: every partition snapshotted
        async with connected(nats.url, "faults") as nc:
            await tear_snapshot(nc.jetstream(), partition("fn0"))
        fault_at = time.monotonic()
        await parts.start("node")
        await running(drivers)
        await finish(row, nats.url, stub, drivers, fault_at)
        await asyncio.gather(*loads)
    return row


async def crash_loop(tmp: Path, stub: PlatformStub, cycles: int = 10, node_dir: bool = True) -> Row:
    """The node killed -9 and started again, `cycles` times, each once its callers are served again. With its
    `--node-dir` (as `scaler up --data-dir` gives it) it comes back under its name and takes its leases back at
    once; without (`node_dir=False`, for a measure of what that saves) it waits for them to lapse."""
    named = "under its name (--node-dir)" if node_dir else "under a new name"
    row = Row("crash loop", f"the node kill -9, started again {named} at once; {cycles} times")
    args = ("--node-dir", str(tmp / "node")) if node_dir else ()
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=args) as parts:
        # Callers that repeat a refused call for 30 s (the others' 20 tries 0.25 s apart last 5 s: a node's restart
        # and the callers' gRPC reconnect took 5.7 s once on this busy machine, and their calls failed)
        drivers = [Driver(parts.gateway, keys=KEYS, clients=6, tag="c-", retry_assign=True, attempts=120)]
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        gaps, starts, first_fault = [], [], 0.0
        for _ in range(cycles):
            await parts.kill("node")
            fault_at = time.monotonic()
            first_fault = first_fault or fault_at
            starts.append(await parts.start("node"))
            await running(drivers, calls=10)
            gaps.append(min(c.got_at for d in drivers for c in d.calls if c.got_at > fault_at) - fault_at)
        await finish(row, nats.url, stub, drivers, first_fault)
        await asyncio.gather(*loads)
    row.recovered_s = statistics.median(gaps)
    row.notes.append(f"answering again after each kill (median in the table): {', '.join(f'{g:.1f}' for g in gaps)} s")
    row.notes.append(f"the node ready after each start: {', '.join(f'{g:.1f}' for g in starts)} s")
    return row


class Up:
    """`scaler up` as a user runs it (its own embedded NATS, here on `data_dir`), against this script's platform
    stub; its stderr kept line by line."""

    READY = re.compile(r"scaler ready: gRPC (\S+), .* nats (nats://\S+) .*, metrics (http://\S+)/metrics")

    def __init__(self, data_dir: Path, stub: PlatformStub) -> None:
        self.args = ["--data-dir", str(data_dir), "--platform", f"127.0.0.1:{stub.port}"]
        self.args += ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--store-limit-gb", "0.01"]
        # A call waits 10 s for its answer (60 by default): calls made while the disk is full are refused in the run
        self.env = {**os.environ, "SCALER_REPLY_TIMEOUT": "10"}
        self.lines: list[str] = []
        self.address = self.nats_url = self.http = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task | None = None

    async def __aenter__(self) -> "Up":
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scaler", "up", *self.args, stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=self.env
        )
        async with asyncio.timeout(60):
            while not self.address:
                line = (await self._proc.stderr.readline()).decode()
                if not line:
                    raise RuntimeError(f"scaler up exited: {''.join(self.lines)}")
                self.lines.append(line)
                if m := self.READY.search(line):
                    self.address, self.nats_url, self.http = m.groups()
        self._reading = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while line := await self._proc.stderr.readline():
            self.lines.append(line.decode())

    def log(self) -> str:
        return "".join(self.lines)

    def said(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def get(self, path: str) -> tuple[int, str]:
        status, body = await monitor_get(self.http, path)
        return status, body.decode(errors="replace")

    async def __aexit__(self, *exc: object) -> None:
        self._proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(self._proc.wait(), 60)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        await self._reading


@contextlib.contextmanager
def small_disk(folder: Path, mb: int) -> Iterator[None]:
    """A filesystem of `mb` MB (tmpfs; this needs root) mounted on `folder` for the time of the block."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """A file that takes every byte left on `folder`'s filesystem."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return filler


async def full_disk(tmp: Path, stub: PlatformStub, hold_s: float = 20) -> Row:
    """The store of `scaler up --data-dir` on a 32 MB filesystem, filled, held full, freed. While it is full no call
    can be stored, so calls fail (excused: refused while the disk was full, or just after); each refusal should
    name the cause. Once the space is back, `scaler up` restarts its nats-server (a stream that had a write error
    takes none until then), and the callers are served again: the table's "answering again after" counts from
    the moment the space was freed."""
    row = Row("full disk", f"`scaler up`'s store on a 32 MB filesystem, filled for {hold_s:g} s, then freed")
    disk = tmp / "disk"
    window = [0.0, 0.0]  # filled, freed (+ the callers' patience: what fails then was refused while full)

    def refused_while_full(call: Call, fault_at: float) -> bool:
        """refused (UNAVAILABLE, DEADLINE_EXCEEDED) while the disk was full, or within 10 s of its freeing"""
        retried = call.error.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        return retried and window[0] <= call.failed_at <= window[1] + 10

    row.excused = refused_while_full
    with small_disk(disk, 32):
        async with Up(disk, stub) as up:
            drivers = [Driver(up.address, keys=KEYS, clients=6, tag="d-", retry_assign=True)]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            filler = await asyncio.to_thread(fill, disk)
            window[0] = time.monotonic()
            said: dict[str, float] = {}
            while time.monotonic() - window[0] < hold_s:
                metrics = (await up.get("/metrics"))[1]
                if 'scaler_store_refusing{cause="disk_full"} 1.0' in metrics:
                    said.setdefault("metric", time.monotonic() - window[0])
                if (await up.get("/healthz"))[0] == 503:
                    said.setdefault("health", time.monotonic() - window[0])
                await asyncio.sleep(0.5)
            filler.unlink()
            fault_at = window[1] = time.monotonic()
            await running(drivers, seconds=120)
            await finish(row, up.nats_url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
            refusals = [r for d in drivers for c in d.calls for r in [c.error, *(r for _, r in c.refusals)] if r]
            named = sum("disk full" in r for r in refusals)
            row.notes.append(
                f"while full: the metric said disk_full after {said.get('metric', -1):.1f} s, /healthz 503 after"
                f" {said.get('health', -1):.1f} s (-1: never); {named} of {len(refusals)} refusals named the full disk"
            )
            relayed = [line.split(" scaler.natsd: ")[1].strip() for line in up.lines if "scaler.natsd: nats-s" in line]
            row.notes.append(
                f"scaler up relayed {len(relayed)} lines of nats-server's log"
                f" ({sum('no space left on device' in r for r in relayed)} naming the full disk; the first: "
                f"{next((r for r in relayed if 'no space' in r), '-')[:160]}), restarted it"
                f" {up.said('nats-server restarted')} time(s)"
            )
            if not up.said("nats-server restarted"):
                row.failed += 1
                row.notes.append("nats-server was not restarted once space was back")
    return row


OWN_DEADLINE = "DEADLINE_EXCEEDED: Deadline Exceeded"  # gRPC's client side: the caller's own deadline ran out
ANSWER_BOUND_S = 3.0  # how soon a call the store cannot take should be refused, well within a caller's deadline


async def stalled_nats(tmp: Path, stub: PlatformStub, stall_s: float = 12) -> Row:
    """nats-server stopped (SIGSTOP) under callers whose calls have 10 s deadlines, then woken. Every call made
    meanwhile should be refused UNAVAILABLE within ANSWER_BOUND_S (the caller then knows the store is away and
    repeats), not held until its own deadline runs out."""
    broke = f"nats-server SIGSTOPped {stall_s:g} s under callers with 10 s deadlines (answering again: from its waking)"
    row = Row("stalled NATS", broke)
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        drivers = [
            Driver(parts.address(n), keys=KEYS, clients=6, tag=f"{n}-", retry_assign=True, timeout_s=10)
            for n in parts.nodes
        ]
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        os.kill(nats.proc.pid, signal.SIGSTOP)
        fault_at = time.monotonic()
        await asyncio.sleep(stall_s)
        os.kill(nats.proc.pid, signal.SIGCONT)
        woken_at = time.monotonic()
        await running(drivers, seconds=120)
        await finish(row, nats.url, stub, drivers, woken_at)  # answering again: after it was woken
        await asyncio.gather(*loads)
    said = [(at, r, c) for d in drivers for c in d.calls for at, r in [*c.refusals, (c.failed_at, c.error)] if r]
    during = [r for at, r, _ in said if fault_at <= at <= woken_at + 10]
    held = sum(r == OWN_DEADLINE for r in during)
    row.notes.append(
        f"refusals while NATS was stopped (and 10 s after): {len(during)}, of which {held} the caller's own 10 s"
        f" deadline running out; {sum(r.startswith('UNAVAILABLE') for r in during)} UNAVAILABLE"
    )
    ran_out = [f"{c.request_id} ({c.key}) at +{at - fault_at:.1f} s" for at, r, c in said if r == OWN_DEADLINE]
    if ran_out:
        row.notes.append(f"ran out their deadline (from the stop): {', '.join(ran_out[:6])}")
    if held:
        row.unmet.append(f"{held} calls ran out their own deadline, not refused within {ANSWER_BOUND_S:g} s")
    return row


async def stall(tmp: Path, stub: PlatformStub, stall_s: float = 5, times: int = 10) -> Row:
    """nats-server stopped (SIGSTOP) `stall_s` and woken, `times` times, under two nodes' callers: every node's
    lease runs out on each stall longer than its renewal deadline, so each stall is also a loss and a reload of
    partitions, with appends sent before it stored after it. Service must be back within 10 s of each waking,
    no request assigned twice, and the store loadable by a fresh node afterwards."""
    row = Row(f"stall {stall_s:g} s x{times}", f"nats-server SIGSTOPped {stall_s:g} s, woken, {times} times; 2 nodes")
    row.excused = refused_while_stalled
    gaps: list[float] = []
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}", nodes=2) as parts:
        await spread(nats.url, 2)
        drivers = [
            Driver(parts.address(n), keys=KEYS, clients=6, tag=f"{n}-", retry_assign=True, attempts=160)
            for n in parts.nodes
        ]
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        first = 0.0
        for _ in range(times):
            os.kill(nats.proc.pid, signal.SIGSTOP)
            first = first or time.monotonic()
            await asyncio.sleep(stall_s)
            os.kill(nats.proc.pid, signal.SIGCONT)
            woken_at = time.monotonic()
            await running(drivers, calls=10, seconds=120)
            gaps.append(min(c.got_at for d in drivers for c in d.calls if c.got_at > woken_at) - woken_at)
        await finish(row, nats.url, stub, drivers, first)
        await asyncio.gather(*loads)
        await parts.supervisor.stop()
        await loadable(row, nats.url)
    row.recovered_s = max(gaps)
    row.notes.append(f"answering again after each waking (the longest in the table): {in_seconds(gaps)}")
    if late := [g for g in gaps if g > SERVING_AGAIN_S]:
        row.unmet.append(f"{len(late)} wakings not answered within {SERVING_AGAIN_S:g} s: {in_seconds(late)}")
    return row


SERVING_AGAIN_S = 10.0  # service back within this long of NATS answering again


def in_seconds(spans: list[float]) -> str:
    return ", ".join(f"{s:.1f}" for s in spans) + " s"


def refused_while_stalled(call: Call, fault_at: float) -> bool:
    """refused UNAVAILABLE or DEADLINE_EXCEEDED 160 times over while NATS stood still, each repeated"""
    return call.error.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))


async def loadable(row: Row, nats_url: str, patience_s: float = 60) -> None:
    """Whether a fresh node loads the whole store the run left (its nodes stopped): every partition served."""
    from scaler.controller.core.policy import get_policy
    from scaler.controller.shell import Controller

    node = Controller(nats_url, get_policy("demo"), node=f"fresh-{os.getpid()}")
    try:
        async with asyncio.timeout(patience_s):
            await node.start()  # alone, it leases every partition and returns once they are loaded
    except Exception as e:
        row.unmet.append(f"a fresh node could not load the store: {type(e).__name__}: {e}")
    else:
        if len(node.serving) < PARTITIONS:
            row.unmet.append(f"a fresh node loaded {len(node.serving)} of the store's {PARTITIONS} partitions")
    finally:
        await node.stop()


async def partition_held(tmp: Path, stub: PlatformStub, cut_s: float = 12) -> Row:
    """Two nodes, node-1 cut off from NATS for `cut_s` (its lease lapses, node takes its partitions over and serves
    their callers), then the link mended: what node-1 sent while cut off arrives then, late, as TCP delivers it once
    a partition heals. A stale node's decision must never be stored over what the new owner decided."""
    row = Row(f"partition {cut_s:g} s", f"node-1 cut off from NATS {cut_s:g} s (what it sent held, delivered late)")
    row.excused = refused_while_stalled
    async with NatsServer(tmp / "nats") as nats, Link("127.0.0.1", nats.port, hold=True) as link:
        cut_off = {"node-1": {"SCALER_NATS_URL": link.url}}
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", nodes=2, env=cut_off) as parts:
            await spread(nats.url, 2)
            drivers = [
                Driver(parts.address(n), keys=KEYS, clients=6, tag=f"{n}-", retry_assign=True, attempts=160)
                for n in parts.nodes
            ]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers)
            link.cut = True
            fault_at = time.monotonic()
            await asyncio.sleep(cut_s)
            link.cut = False
            await spread(nats.url, 2)
            await running(drivers, seconds=120)
            await finish(row, nats.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
            await parts.supervisor.stop()
            await loadable(row, nats.url)
    return row


async def slow_init(tmp: Path, stub: PlatformStub, seconds: float = 60) -> Row:
    """Functions whose Init takes 5 to 30 s, called with 15 s deadlines and repeated when refused, beside warm
    callers: every call the scaler cannot answer in time must be refused by it (DEADLINE_EXCEEDED or UNAVAILABLE,
    its own message) while its caller still listens, never left to run out the caller's own deadline."""
    row = Row("slow Init", "Init taking 5-30 s, callers' deadlines 15 s, repeated when refused")
    row.excused = refused_in_time
    inits = {f"slow{n}": 5_000 + n * 5_000 for n in range(6)}  # 5, 10, ... 30 s
    stub.metas.update({k: FunctionMeta(key=k, memory_in_mb=128, init_duration_in_ms=ms) for k, ms in inits.items()})
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        slow = Driver(parts.gateway, keys=tuple(inits), clients=12, tag="slow-", retry_assign=True, timeout_s=15)
        warm = Driver(parts.gateway, keys=KEYS, clients=6, tag="warm-", retry_assign=True)
        loads = [asyncio.create_task(d.run()) for d in (slow, warm)]
        fault_at = time.monotonic()
        await asyncio.sleep(seconds)
        await finish(row, nats.url, stub, [slow, warm], fault_at)
        await asyncio.gather(*loads)
    said = [r for c in slow.calls for r in [*(r for _, r in c.refusals), c.error] if r]
    own = sum(r == OWN_DEADLINE for r in said)
    row.notes.append(f"{len(slow.calls)} calls of the slow functions, {len(said)} refusals, {own} by the caller's own"
                     " deadline")  # fmt: skip
    if own:
        row.unmet.append(f"{own} calls ran out their caller's own deadline: the scaler did not answer in time")
    return row


def refused_in_time(call: Call, fault_at: float) -> bool:
    """a call of a slow function refused DEADLINE_EXCEEDED by the scaler (its Init longer than the caller waits),
    repeated until its attempts ran out"""
    return call.key.startswith("slow") and call.error.startswith("DEADLINE_EXCEEDED: no answer within")


async def stream_deleted(tmp: Path, stub: PlatformStub) -> Row:
    """The EVENTS stream deleted under a running node and its callers (an operator's mistake, a bad script): the
    node must notice, make the stream again, say so, report unhealthy until it serves again, and leak no slot."""
    row = Row("stream deleted", "the EVENTS stream deleted under a running node (`nats stream rm`)")
    row.excused = lost_with_the_stream
    port = free_port()
    args = ("--metrics-port", str(port))  # its /healthz
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=args) as parts:
        drivers = [Driver(parts.gateway, keys=KEYS, clients=6, tag="s-", retry_assign=True, attempts=160)]
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        async with connected(nats.url, "faults") as nc:
            await nc.jetstream().delete_stream(EVENTS)
        fault_at = time.monotonic()
        unhealthy = await health_while(f"http://127.0.0.1:{port}", lambda: served_since(drivers, fault_at), 60)
        await running(drivers, seconds=120)
        await finish(row, nats.url, stub, drivers, fault_at)
        await asyncio.gather(*loads)
    row.notes.append(f"/healthz unhealthy for {unhealthy:.1f} s of it" if unhealthy else "/healthz never unhealthy")
    if not unhealthy:
        row.unmet.append("/healthz said 200 while the node could not serve")
    return row


def lost_with_the_stream(call: Call, fault_at: float) -> bool:
    """the Idle of a request assigned in the deleted stream, or a call refused while the node made it again"""
    return idle_of_a_lost_assignment(call, fault_at) or refused_while_stalled(call, fault_at)


async def retention_cut(tmp: Path, stub: PlatformStub) -> Row:
    """EVENTS's limits cut behind the node's back (5 s, 50 batches): the batches it drops are held by no snapshot
    yet. The node must notice, say so, snapshot what it holds at once and put its limits back, so that a fresh node
    still loads every partition exactly."""
    row = Row("retention cut", "EVENTS's limits cut to 5 s and 50 batches behind the node's back")
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        drivers = callers(parts)
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        async with connected(nats.url, "faults") as nc:
            js = nc.jetstream()
            config = (await js.stream_info(EVENTS)).config
            config.max_age, config.max_msgs, config.duplicate_window = 5.0, 50, 5.0
            await js.update_stream(config)
        fault_at = time.monotonic()
        await asyncio.sleep(10)
        await running(drivers)
        async with connected(nats.url, "faults") as nc:
            config = (await nc.jetstream().stream_info(EVENTS)).config
        if config.max_msgs == 50 or config.max_age == 5.0:
            row.unmet.append(f"its limits were left cut: max_age {config.max_age} s, max_msgs {config.max_msgs}")
        await finish(row, nats.url, stub, drivers, fault_at)
        await asyncio.gather(*loads)
        await parts.supervisor.stop()
        await loadable(row, nats.url)
    return row


def served_since(drivers: list[Driver], at: float) -> bool:
    return any(c.got_at > at for d in drivers for c in d.calls)


async def health_while(url: str, done: Callable[[], bool], seconds: float) -> float:
    """How long the node's /healthz (at `url`) said it was unhealthy (not 200) until `done()`."""
    unhealthy, began = 0.0, time.monotonic()
    while not done() and time.monotonic() - began < seconds:
        try:
            status, _ = await monitor_get(url, "/healthz")
        except Exception:
            status = 0
        if status != 200:
            unhealthy += 0.25
        await asyncio.sleep(0.25)
    return unhealthy


def faketime_library() -> str:
    """The libfaketime to preload: Debian's `faketime` package's, else the one PyPI's `libfaketime` (a test extra)
    ships, built for x86_64; '' when neither is here."""
    if debian := sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")):
        return debian[0]
    spec = importlib.util.find_spec("libfaketime")
    if spec is not None and spec.submodule_search_locations and platform.machine() == "x86_64":
        shipped = Path(spec.submodule_search_locations[0]) / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
        if shipped.exists():
            return str(shipped)
    return ""


FAKETIME = faketime_library()
HAVE_FAKETIME = bool(FAKETIME)
NO_FAKETIME = "no libfaketime: pip install libfaketime (the test extra), or apt-get install faketime"


def ensure_faketime() -> str:
    """libfaketime, Debian's `faketime` installed first when neither is here and this is root; '' if still none."""
    global FAKETIME, HAVE_FAKETIME
    if not FAKETIME and os.geteuid() == 0 and shutil.which("apt-get"):
        with contextlib.suppress(NoFuse, subprocess.CalledProcessError):
            apt_install("faketime")
        FAKETIME = faketime_library()
        HAVE_FAKETIME = bool(FAKETIME)
    return FAKETIME


async def skew(tmp: Path, stub: PlatformStub, skew_s: int = -120) -> Row:
    """Two nodes, node-1's wall clock `skew_s` off (libfaketime; its monotonic clock untouched), callers holding
    instances 6 s each (functions with a 60 s timeout) through the other node; node-1 killed -9, the other takes
    its partitions over and decides for the requests node-1 assigned. Its elapsed times must be its own: no
    request released as timed out under its caller, no instance handed to a second request meanwhile."""
    row = Row(f"skew {skew_s:+d} s", f"two nodes, node-1's wall clock {skew_s:+d} s off, killed -9; node takes over")
    if not ensure_faketime():
        row.unmet.append(NO_FAKETIME)
        return row
    clock = {"LD_PRELOAD": FAKETIME, "FAKETIME": f"{skew_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    async with NatsServer(tmp / "nats") as nats:
        async with Parts(nats.url, f"127.0.0.1:{stub.port}", nodes=2, env={"node-1": clock}) as parts:
            await spread(nats.url, 2)
            address = parts.address("node")  # it passes on the calls of node-1's partitions, and later decides them
            drivers = [
                Driver(address, keys=KEYS, clients=6, tag="hold-", retry_assign=True, hold_s=6, function_timeout_s=60),
                Driver(address, keys=KEYS, clients=6, tag="quick-", retry_assign=True, function_timeout_s=60),
            ]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers, calls=6)
            async with connected(nats.url, "faults") as nc:
                before = await holders(nc.jetstream())
            await parts.kill("node-1")
            fault_at = time.monotonic()
            await spread(nats.url, 1)
            async with connected(nats.url, "faults") as nc:
                survivor = set((await holders(nc.jetstream())).values())
            theirs = {p for p, n in before.items() if n not in survivor}  # node-1's partitions
            await running(drivers, calls=12, seconds=120)
            await finish(row, nats.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
            timed_out = await released_under_their_callers(nats.url, [c for d in drivers for c in d.calls])
    held = [c for c in drivers[0].calls if 0 < c.got_at < fault_at < c.idle_at and partition(c.key) in theirs]
    row.notes.append(f"{len(held)} requests node-1 assigned were held through the take-over")
    if timed_out:
        row.unmet.append(f"{len(timed_out)} requests released as timed out while their callers held them (6 s of a"
                         f" 60 s timeout): {', '.join(timed_out[:3])}")  # fmt: skip
    if not held:
        row.unmet.append("no request was held across the take-over: the fault did not test it")
    return row


async def released_under_their_callers(nats_url: str, calls: list[Call]) -> list[str]:
    """Requests the stored log releases for want of an Idle ("no Idle within ..."), though their callers sent it."""
    idled = {c.request_id for c in calls if c.idle_at}
    out: list[str] = []

    def look(_: int, batch) -> None:
        for e in batch.events:
            if isinstance(e, Released) and e.reason.startswith("no Idle within") and e.request_id in idled:
                out.append(f"{e.request_id} ({e.reason})")

    async with connected(nats_url, "faults") as nc:
        await stream.read(nc.jetstream(), look)
    return out


@dataclass
class RefusedOrLetGo:
    """a request of a new function while the platform failed every start, or of a warm one whose policy had let
    its instances go before the platform began failing: nothing could serve it (failed, or throttled while its
    starts were held)"""

    let_go: set[str]  # the warm functions with no instance ready when the platform began failing (`none_ready`)
    ended: float  # when the platform worked again (the worker's circuit may hold starts a little longer: it says so)

    def __call__(self, call: Call, fault_at: float) -> bool:
        held = "the platform's circuit open" in call.error
        let_go_then = call.key in self.let_go and fault_at <= call.failed_at and (call.failed_at <= self.ended or held)
        return (call.key.startswith("cold") or let_go_then) and call.error.startswith(("INTERNAL", "THROTTLE"))


def wall_ms(at: float) -> int:
    """A moment of time.monotonic() on the wall clock the node stamps its batches with (ms)."""
    return int((time.time() - (time.monotonic() - at)) * 1000)


async def none_ready(nats_url: str, keys: tuple[str, ...], at: float) -> set[str]:
    """The functions of `keys` with no instance idle or busy at `at` (time.monotonic()), from the stream: the policy
    had let them go (a keep-alive ended, or a retirement to start again later), and a call of theirs needs a start."""
    async with connected(nats_url, "faults") as nc:
        states = (await replay.replay(nc, until_ms=wall_ms(at))).states
    ready = (Phase.IDLE, Phase.BUSY)
    return {k for k in keys if k not in states or not any(i.phase in ready for i in states[k].instances.values())}


async def failing_platform(tmp: Path, stub: PlatformStub, failing_s: float = 15) -> Row:
    """Init answers InternalError for `failing_s`, then CreateSlot does; callers of warm functions all along, and
    8 callers of new functions during each. A new function's requests can only fail (excused), and so can those of
    a warm function whose policy had let its instances go when the platform began failing (its calls ~0.4 s apart,
    the stub's starts ~150 ms: learned may let it go between calls, more so when a loaded machine spaces them out);
    a warm function's requests should be served by its instances as they free up. The platform should not be
    hammered: the starts it is asked for, against the requests that failed."""
    row = Row("failing platform", f"Init, then CreateSlot, answering InternalError for {failing_s:g} s each")
    calls = Counter()

    def failing(what: str):
        def fault(_) -> str:
            calls[what] += 1
            return "injected InternalError"

        return fault

    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        warm = callers(parts, "warm")
        loads = [asyncio.create_task(d.run()) for d in warm]
        await running(warm)
        await served(warm, KEYS)  # each of the 12 is warm: 30 calls of 6 clients reach only 10 of them
        fault_at = time.monotonic()
        began: dict[str, float] = {}
        for what in ("init", "create"):
            created = stub.accounting.created
            began[what] = time.monotonic()
            setattr(stub.faults, what, failing(what))
            cold = Driver(parts.gateway, keys=(f"cold-{what}-a", f"cold-{what}-b"), clients=8, tag=f"cold-{what}-")
            cold_load = asyncio.create_task(cold.run())
            await asyncio.sleep(failing_s)
            setattr(stub.faults, what, lambda _: None)
            cold.stop()
            await cold_load
            failed = sum(1 for c in cold.calls if c.error)
            row.notes.append(
                f"{'Init' if what == 'init' else 'CreateSlot'} failing: {failed} requests of new functions failed,"
                f" for {calls[what]} {what} calls that failed and {stub.accounting.created - created} slots created"
            )
            warm.append(cold)  # its calls are checked with the rest
        ended = time.monotonic()  # the platform works again
        await running(warm[:-2], seconds=120)
        let_go = await none_ready(nats.url, KEYS, fault_at)
        row.excused = RefusedOrLetGo(let_go, ended)
        await finish(row, nats.url, stub, warm, fault_at)
        if let_go:
            row.notes.append(f"warm functions with no instance ready when the platform began failing: {sorted(let_go)}")

        def phase(at: float) -> str:
            return "Init failing" if at < began["create"] else "CreateSlot failing" if at < ended else "after"

        refused = sorted((c for d in warm[:-2] for c in d.calls if c.error), key=lambda c: c.failed_at)
        kinds = Counter(f"{phase(c.failed_at)}: {c.error.split(':')[0]}" for c in refused)
        if kinds:
            row.notes.append(f"requests of the warm functions refused: {dict(kinds)}")
            first = next((c for c in refused if not row.excused(c, fault_at)), refused[0])
            row.notes += await before_refused(nats.url, first)
        await asyncio.gather(*loads)
    return row


async def before_refused(nats_url: str, call: Call, seconds: float = 3, most: int = 16) -> list[str]:
    """What the function of a refused call did in the `seconds` before it (its last `most` events, from the stream):
    why none of its instances could take the call."""
    at_ms = wall_ms(call.failed_at)
    told: list[str] = []

    def seen(seq: int, batch) -> None:
        if at_ms - seconds * 1000 <= batch.at_ms <= at_ms:
            told.extend(f"    {explain.clock(e.at_ms)} {explain.event(e)}" for e in batch.events)

    async with connected(nats_url, "faults") as nc:
        await replay.replay(nc, call.key, seen=seen)
    return [f"{call.key}'s events before {call.request_id} was refused at {explain.clock(at_ms)}:", *told[-most:]]


@dataclass
class Acknowledged:
    """A power-loss fault's count: the Assigns the callers heard answered before the cut, and how many of them the
    stream holds after the restart (each as the request and the instance it was given)."""

    before_cut: int
    found: int
    lost: list[str]  # "<request> -> <instance>", the first few


async def acknowledged_in_the_stream(nats_url: str, calls: list[Call], cut_at: float) -> Acknowledged:
    """Every Assign a caller heard answered before `cut_at`, looked for in the stream read after the restart."""
    acked = {(c.request_id, c.instance) for c in calls if c.instance and 0 < c.got_at < cut_at}
    stored: set[tuple[str, str]] = set()

    def look(_: int, batch) -> None:
        stored.update((e.request_id, e.instance_id) for e in batch.events if isinstance(e, Assigned))

    async with connected(nats_url, "faults") as nc:
        await stream.read(nc.jetstream(), look)
    lost = sorted(acked - stored)
    return Acknowledged(len(acked), len(acked) - len(lost), [f"{r} -> {i}" for r, i in lost[:5]])


async def cut_power(
    disks: list[PowerCutDisk], servers: list[NatsServer], parts: Parts, on_it: tuple[str, ...]
) -> dict[str, tuple[int, int]]:
    """A power cut of the machines of `disks`: their nats-servers and the parts `on_it` killed -9 at once, what their
    disks had not synced dropped (tests/powercut.py), then the disks mounted again and everything started again.
    Returns the files the cut took data from, with their sizes before and after it."""
    await asyncio.gather(*(s.stop(kill=True) for s in servers), *(parts.kill(p) for p in on_it))
    unsynced = {f"{d.mount.name}/{path}": sizes for d in disks for path, sizes in d.unsynced().items()}
    for disk in disks:
        await disk.cut()
        await disk.start()
    await asyncio.gather(*(s.start() for s in servers))
    for p in on_it:
        await parts.start(p)
    return unsynced


async def power_loss(tmp: Path, stub: PlatformStub, node_files: bool = False) -> Row:
    """nats-server's store on a disk that loses what was not synced (tests/powercut.py), callers assigning and
    idling; then its power cut mid-burst (with the node, its name and lock on the same disk, when `node_files`) and
    everything started again. Every Assign answered before the cut must be in the stream after it."""
    what = "nats-server and the node, its name and lock on that disk" if node_files else "nats-server"
    row = Row("power loss" + (", node's files" if node_files else ""), f"the power of {what} cut mid-burst (unsynced"
              " writes dropped), restarted")  # fmt: skip
    disk = PowerCutDisk(tmp / "disk", tmp / "mount")
    await disk.start()
    try:
        args = ("--node-dir", str(disk.mount / "node")) if node_files else ()
        async with (
            NatsServer(disk.mount / "nats") as nats,
            Parts(nats.url, f"127.0.0.1:{stub.port}", node_args=args) as parts,
        ):
            drivers = [Driver(parts.gateway, keys=KEYS, clients=8, tag="p-", retry_assign=True, attempts=160)]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers, calls=60)
            names = await node_names(nats.url)
            fault_at = time.monotonic()
            dropped = await cut_power([disk], [nats], parts, ("node",) if node_files else ())
            await running(drivers, seconds=120)
            await finish(row, nats.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
            await acknowledged(row, nats.url, drivers, fault_at, dropped)
            if node_files and (after := await node_names(nats.url)) != names:
                row.unmet.append(f"the node came back as {after}, not under its name {names}")
            elif node_files:
                row.notes.append(f"the node came back under its name ({', '.join(sorted(names))})")
    finally:
        await disk.stop()
    return row


async def power_loss_cluster(tmp: Path, stub: PlatformStub, cut: int = 1) -> Row:
    """A 3-server cluster (R3, every write synced), each server's store on a disk of its own that loses what was not
    synced; callers assigning and idling through two nodes; then the power of `cut` servers cut at once mid-burst
    (the EVENTS leader's first) and those started again. Every Assign answered before the cut must be in the
    stream after it."""
    row = Row(f"power loss, {cut} of 3 servers", f"3-server cluster, R3; the power of {cut} server(s) cut at once"
              " mid-burst (the EVENTS leader's among them), restarted")  # fmt: skip
    cluster = NatsCluster(tmp / "cluster")
    disks = [PowerCutDisk(tmp / f"disk{n}", tmp / f"mount{n}") for n in range(len(cluster.servers))]
    for server, disk in zip(cluster.servers, disks, strict=True):
        server.store_dir = disk.mount / "nats"
    try:
        for disk in disks:
            await disk.start()
        async with cluster, Parts(cluster.url, f"127.0.0.1:{stub.port}", nodes=2, replicas=3) as parts:
            await spread(cluster.url, 2)
            drivers = [
                Driver(parts.address(n), keys=KEYS, clients=6, tag=f"{n}-", retry_assign=True, attempts=160)
                for n in parts.nodes
            ]
            loads = [asyncio.create_task(d.run()) for d in drivers]
            await running(drivers, calls=60)
            async with connected(cluster.url, "faults") as nc:
                leader = (await nc.jetstream().stream_info(EVENTS)).cluster.leader
            chosen = sorted(range(len(cluster.servers)), key=lambda n: cluster.servers[n].name != leader)[:cut]
            row.broke += f" ({', '.join(cluster.servers[n].name for n in chosen)}; {leader} led EVENTS)"
            fault_at = time.monotonic()
            dropped = await cut_power([disks[n] for n in chosen], [cluster.servers[n] for n in chosen], parts, ())
            try:
                await running(drivers, seconds=120)
            except TimeoutError:  # the checks still run: what was stored, and which partitions nobody serves
                row.unmet.append("the callers were not all served again within 120 s of the restart")
                parts.say_where_tasks_wait()  # into the log, for whoever reads why
            await finish(row, cluster.url, stub, drivers, fault_at)
            await asyncio.gather(*loads)
            await acknowledged(row, cluster.url, drivers, fault_at, dropped)
    finally:
        for disk in disks:
            await disk.stop()
    return row


async def acknowledged(
    row: Row, nats_url: str, drivers: list[Driver], cut_at: float, dropped: dict[str, tuple[int, int]]
) -> None:
    """The fault's own checks: the Assigns answered before the cut are all in the stream, and the cut dropped data
    (else it tested nothing)."""
    lost_bytes = sum(abs(shown - kept) for shown, kept in dropped.values())
    files = ", ".join(f"{path} {shown} -> {kept} B" for path, (shown, kept) in sorted(dropped.items())[:4])
    row.notes.append(f"the cut dropped unsynced data of {len(dropped)} files ({lost_bytes:,} bytes): {files}")
    if not dropped:
        row.unmet.append("the cut dropped nothing: the fault did not test a loss")
    row.acknowledged = await acknowledged_in_the_stream(nats_url, [c for d in drivers for c in d.calls], cut_at)
    if lost := row.acknowledged.lost:
        row.unmet.append(f"{row.acknowledged.before_cut - row.acknowledged.found} Assigns answered before the cut"
                         f" are not in the stream: {', '.join(lost)}")  # fmt: skip


async def node_names(nats_url: str) -> set[str]:
    """The nodes holding leases."""
    async with connected(nats_url, "faults") as nc:
        return set((await holders(nc.jetstream())).values())


KILL_WINDOW_MS = 100


async def answered_at_a_kill(row: Row, nats_url: str, stub: PlatformStub, kills_ms: list[int]) -> dict[str, str]:
    """The slots whose CreateSlot was answered within KILL_WINDOW_MS of a kill of the worker that asked (the answer
    into a dead connection, or heard and not yet recorded): on a platform that neither lists nor dedupes, nothing
    can name them (docs/faults.md); another start's CreateSlot, not this fault's Init. Said, and not counted as
    leaked; any other slot left over is. Returns them (slot -> CreateSlot request id)."""
    window = {
        s.id: s.request_id for s in stub.accounting.slots.values()
        if s.created_done_ms and any(abs(s.created_done_ms - k) <= KILL_WINDOW_MS for k in kills_ms)
    }  # fmt: skip
    known = slots_of((await controller_state(nats_url)).states)
    stray = sorted(s for s in window if s in stub.accounting.live and s not in known)
    if stray:  # counted again: when the state and the platform never settled, `finish` counted every live slot
        row.leaked = len(set(stub.accounting.live) - known - set(stray))
        row.notes.append(f"{len(stray)} slots of other starts whose CreateSlot was answered within {KILL_WINDOW_MS} ms"
                         f" of a kill, left to the platform (it can neither list nor dedupe): "
                         f"{', '.join(f'{s} ({window[s]})' for s in stray)}")  # fmt: skip
    return {s: window[s] for s in stray}


def creating(stub: PlatformStub, but: str, within_ms: int = 250) -> bool:
    """Whether a CreateSlot (of a slot other than `but`) is under way or was answered within `within_ms`: a worker
    killed now may not have recorded that slot, which a platform that neither lists nor dedupes leaves to leak
    (docs/faults.md); a kill meant for an Init waits for another Init."""
    now = stub.clock.now_ms()
    return any(not s.created_done_ms or now - s.created_done_ms < within_ms
               for s in stub.accounting.live.values() if s.id != but)  # fmt: skip


async def worker_killed(tmp: Path, stub: PlatformStub, kills: int = 3) -> Row:
    """The platform worker killed -9 as the platform's answer goes out, so the worker never reports it: `kills` times
    as Init finishes and, on a platform that lists its slots, `kills` times as CreateSlot does (on one that neither
    lists nor dedupes, that slot leaks: docs/faults.md); each time under callers of new functions, whose starts the
    next worker takes over. No effect may be done twice: no slot made twice for one CreateSlot request id, no second
    Init on a slot (the challenge's platform refuses it, an error it counts), and where the platform lists its
    slots, no instance initialised twice (its Init found, not repeated)."""
    lists = stub.mode.lists
    moments = ["Init"] + (["CreateSlot"] if lists else [])
    row = Row(f"worker killed ({'listing' if lists else 'challenge'})", f"the platform worker kill -9 as the"
              f" platform answers {' or '.join(moments)}, before it is reported; {kills} times each")  # fmt: skip
    async with NatsServer(tmp / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}") as parts:
        drivers = [Driver(parts.gateway, keys=KEYS, clients=4, tag="w-", retry_assign=True, attempts=160)]
        loads = [asyncio.create_task(d.run()) for d in drivers]
        await running(drivers)
        fault_at, kills_ms = time.monotonic(), []
        for moment in moments:
            for n in range(kills):
                answered = asyncio.Event()
                worker = parts.running["platform_worker"].proc

                def kill(request, *_: object, answered: asyncio.Event = answered, pid: int = worker.pid) -> None:
                    slot = getattr(request, "slot_id", "")  # an Init's (a CreateSlot is killed at only where it lists)
                    if not answered.is_set() and (lists or not creating(stub, but=slot)):
                        os.kill(pid, signal.SIGKILL)  # before the answer goes out: the worker never hears it
                        kills_ms.append(stub.clock.now_ms())
                        answered.set()

                setattr(stub.faults, "inited" if moment == "Init" else "created", kill)
                colds: list[Driver] = []
                while not answered.is_set():  # a new function at a time, until one's start is killed
                    key = f"new-{moment}-{n}-{len(colds)}"
                    colds.append(Driver(parts.gateway, keys=(key,), clients=1, tag=f"{key}-", retry_assign=True,
                                        attempts=160))  # fmt: skip
                    loads.append(asyncio.create_task(colds[-1].run()))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(answered.wait(), 10)
                    if len(colds) > 10:
                        raise RuntimeError(f"no {moment} answered apart from another start in {len(colds)} tries")
                drivers += colds
                stub.faults.inited, stub.faults.created = (lambda _: None), (lambda *_: None)
                await worker.wait()
                await parts.start("platform_worker")
                await running(colds, calls=3, seconds=120)
        await finish(row, nats.url, stub, drivers, fault_at)
        await asyncio.gather(*loads)
        window = {} if lists else await answered_at_a_kill(row, nats.url, stub, kills_ms)
    a = stub.accounting
    # Slots whose CreateSlot was answered: one torn down as its caller died (the challenge's way) was never made
    made_for = Counter(s.request_id for s in a.slots.values() if s.request_id and s.created_done_ms)
    for request_id in set(window.values()):
        made_for[request_id] = min(made_for[request_id], 1)
    twice = sorted(r for r, n in made_for.items() if n > 1)
    slots_inited = Counter(slot for slot, _ in a.init_calls)
    instances_inited = Counter(instance for _, instance in a.init_calls)
    again = sorted(i for i, n in instances_inited.items() if n > 1)
    row.notes.append(f"{len(a.init_calls)} Inits on {len(slots_inited)} slots for {len(instances_inited)} instances;"
                     f" {sum('/replacing/' in r for r in made_for)} slots made to replace one whose Init"
                     " could not be found")  # fmt: skip
    if twice:
        row.unmet.append(f"slots made twice for one CreateSlot request: {', '.join(twice[:4])}")
    if a.refused_inits or any(n > 1 for n in slots_inited.values()):
        row.unmet.append(f"a second Init on a slot: {', '.join(a.refused_inits[:3])}")
    if again and lists:
        row.unmet.append(f"instances initialised twice though the platform lists its slots: {', '.join(again[:4])}")
    elif again:
        row.notes.append(f"instances initialised again on a new slot (the platform cannot say whether the first Init"
                         f" ran): {', '.join(again[:4])}")  # fmt: skip
    return row


LISTING = {"lost-tail"}  # faults run against the stub's listing mode (see lost_tail)
STUB_MODES = {"worker-killed-listing": "list"}  # ... and against another of its modes
FAULTS = {
    "pause": pause,
    "leader": leader,
    "lost-tail": lost_tail,
    "idle-then-crash": idle_then_crash,
    "upgrade": upgrade,
    "torn": torn,
    "crash-loop": crash_loop,
    "full-disk": full_disk,
    "stalled-nats": stalled_nats,
    "stall-5": lambda tmp, stub: stall(tmp, stub, 5),
    "stall-12": lambda tmp, stub: stall(tmp, stub, 12),
    "stall-20": lambda tmp, stub: stall(tmp, stub, 20),
    "partition": partition_held,
    "stream-deleted": stream_deleted,
    "retention-cut": retention_cut,
    "slow-init": slow_init,
    "skew": skew,
    "skew-far-behind": lambda tmp, stub: skew(tmp, stub, -600),
    "skew-ahead": lambda tmp, stub: skew(tmp, stub, 600),
    "skew-near-ahead": lambda tmp, stub: skew(tmp, stub, 120),
    "failing-platform": failing_platform,
    "power-loss": power_loss,
    "power-loss-node-files": lambda tmp, stub: power_loss(tmp, stub, node_files=True),
    "power-loss-cluster-1": lambda tmp, stub: power_loss_cluster(tmp, stub, 1),
    "power-loss-cluster-2": lambda tmp, stub: power_loss_cluster(tmp, stub, 2),
    "power-loss-cluster-3": lambda tmp, stub: power_loss_cluster(tmp, stub, 3),
    "worker-killed": worker_killed,
    "worker-killed-listing": worker_killed,
}


def table(rows: list[Row]) -> str:
    head = (
        "| fault | what was broken | calls | failed | repeated | answering again after | assigned twice"
        " | held by two | replay = state | slots leaked | snapshots hold |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
    )
    lines = [head]
    for r in rows:
        after = f"{r.recovered_s:.1f} s" if r.recovered_s is not None else "-"
        failed = f"{r.failed} (+{r.failed_by_fault} lost)" if r.failed_by_fault else f"{r.failed}"
        lines.append(
            f"| {r.fault} | {r.broke} | {r.calls} | {failed} | {r.repeated} | {after} | {r.twice} | {r.overlaps}"
            f" | {'yes' if r.replay_equal else 'NO'} | {r.leaked} | {'yes' if r.snapshots_ok else 'NO'} |"
        )
    return "\n".join(lines)


def acknowledged_table(rows: list[Row]) -> str:
    """The power losses' own table: what the callers were told was assigned before the cut, against the stream."""
    lines = [
        "| fault | Assigns answered before the cut | found in the stream after the restart | lost |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        if (a := r.acknowledged) is not None:
            lines.append(f"| {r.fault} | {a.before_cut} | {a.found} | {a.before_cut - a.found} |")
    return "\n".join(lines) if len(lines) > 2 else ""


REPEATED = {"pause": 10}  # the worst faults, run this many times in a row: a race may pass once


async def main(names: list[str], times: dict[str, int]) -> int:
    rows = []
    for name in [each for fault in names for each in [fault] * times.get(fault, 1)]:
        mode = MODES[STUB_MODES[name]] if name in STUB_MODES else None
        stub = PlatformStub("127.0.0.1:0", create_latency_ms=50, like_challenge=name not in LISTING, mode=mode)
        await stub.start()
        began = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as tmp:
                row = await FAULTS[name](Path(tmp), stub)
        except Exception as e:
            row = Row(name, notes=[f"the run itself failed: {type(e).__name__}: {e}"])
        finally:
            await stub.stop()
        notes = [*row.notes, *(f"NOT MET: {u}" for u in row.unmet)]
        print(f"{name}: {'passed' if row.passed else 'FAILED'} in {time.monotonic() - began:.0f} s", *notes,
              sep="\n  ", file=sys.stderr, flush=True)  # fmt: skip
        rows.append(row)
    print(table(rows))
    if acknowledged := acknowledged_table(rows):
        print(f"\n{acknowledged}")
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("faults", nargs="*", choices=[*FAULTS, []], help="which faults (default: all)")
    parser.add_argument("--once", action="store_true", help=f"each fault once (by default: {REPEATED})")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.faults or list(FAULTS), REPEATED if not args.once else {})))
