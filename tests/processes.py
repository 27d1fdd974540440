"""The scaler as `scaler up` runs it, one process per part, so a test can kill -9 one and start it again.

The platform stub stays in the test's process: it is the platform, which outlives our crashes,
and the test reads its exact accounting. A small driver plays clients that assign, hold, idle.
"""

import argparse
import asyncio
import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from scaler.cli.up import Child, Supervisor
from scaler.controller import state_service
from scaler.controller.core.state import FnState, Instance, Phase
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.bus import connected
from scaler.runtime.ports import free_port
from scaler.runtime.tls import ClientTls, channel
from scaler.simulator.dataset import Dataset, Request


def refused(*args: str) -> tuple[int, str]:
    """`python -m scaler ARGS` refused: its exit status and its one line of why (stderr's last), with no traceback
    before it. Refused before anything starts (argparse's exit 2, or 1 for a refusal after parsing)."""
    done = subprocess.run([sys.executable, "-m", "scaler", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and done.stderr.strip(), done
    assert "Traceback" not in done.stderr and "nats-server" not in done.stderr, done.stderr
    return done.returncode, done.stderr.splitlines()[-1]


@contextlib.contextmanager
def stderr_to(path: Path):
    """Children started within inherit `path` (appended to) as their stderr: their log read as it grows, whole. Not
    pytest's capfd, whose reads rewind and truncate the file a child still writes to, and lose what it wrote then."""
    kept = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(kept, 2)
        os.close(kept)
        os.close(log)


class Parts:
    """The nodes (gRPC gateway + controller: `node`, `node-1`, ...), the platform worker and the gc worker
    as real subprocesses."""

    def __init__(
        self,
        nats_url: str,
        platform: str,
        reply_timeout_s: float = 30,
        ack_wait_s: float = 2.0,
        front: bool = False,
        nodes: int = 1,
        replicas: int = 1,
        node_args: tuple[str, ...] = (),
        policy: str = "",
        worker_args: tuple[str, ...] = (),
        env: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.platform = platform
        self.reply_timeout_s = reply_timeout_s
        self.ack_wait_s = ack_wait_s  # short: a killed worker's event comes back soon
        self.front = front  # a front gateway forwarding to the node, and the clients call it
        self.replicas = replicas
        self.node_args = node_args  # more flags for every node
        self.worker_args = worker_args  # ... and for both workers
        self.env = env or {}  # more environment for some parts, by name
        self.nodes = ["node", *(f"node-{n}" for n in range(1, nodes))]
        # kept across restarts, as a platform expects
        self.ports = {name: free_port() for name in (*self.nodes, "gateway")}
        self.supervisor = Supervisor(argparse.Namespace())
        self.supervisor.env = {"SCALER_NATS_URL": nats_url, "SCALER_LOG_LEVEL": "WARNING", "SCALER_SPEED": "1"}
        if policy:
            self.supervisor.env["SCALER_POLICY"] = policy
        self.running: dict[str, Child] = {}

    def argv(self, part: str) -> list[str]:
        """`python -m` and the arguments that start `part`."""
        timeout = ["--reply-timeout", str(self.reply_timeout_s)]
        workers = ["--platform", self.platform, "--ack-wait", str(self.ack_wait_s), *self.worker_args]
        if part in self.nodes:
            listen = f"127.0.0.1:{self.ports[part]}"
            return ["scaler", "node", "--listen", listen, "--replicas", str(self.replicas), *timeout, *self.node_args]
        return {
            "platform_worker": ["scaler.workers", "platform", *workers],
            "gc_worker": ["scaler.workers", "gc", *workers],
            "gateway": ["scaler.gateway", "--listen", f"127.0.0.1:{self.ports['gateway']}", *timeout],
        }[part]

    async def start(self, part: str) -> float:
        """Start one part; returns how long it took to be ready (seconds)."""
        began = time.monotonic()
        self.running[part] = await self.supervisor.spawn(*self.argv(part), name=part, env_extra=self.env.get(part))
        return time.monotonic() - began

    async def __aenter__(self) -> "Parts":
        for part in [*self.nodes, "platform_worker", "gc_worker", *(["gateway"] if self.front else [])]:
            await self.start(part)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.supervisor.stop()

    @property
    def gateway(self) -> str:
        """Where clients call: the front gateway when there is one, else the (first) node."""
        return self.address("gateway" if self.front else "node")

    def address(self, part: str) -> str:
        return f"127.0.0.1:{self.ports[part]}"

    def say_where_tasks_wait(self) -> None:
        """Have each node still running log where every task of its waits (SIGUSR2, scaler/runtime/tasks.py): what
        the nodes are stuck in when a fault leaves the callers unserved."""
        for part in self.nodes:
            if (running := self.running.get(part)) is not None and running.proc.returncode is None:
                running.proc.send_signal(signal.SIGUSR2)

    async def kill(self, part: str) -> None:
        """kill -9: no cleanup, no ack, no goodbye."""
        proc = self.running[part].proc
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


@dataclass
class Call:
    request_id: str
    key: str
    instance: str = ""
    got_at: float = 0.0  # monotonic: answer received
    idle_at: float = 0.0  # monotonic: Idle sent
    idled_at: float = 0.0  # monotonic: the Idle answered
    error: str = ""
    failed_at: float = 0.0  # monotonic: the error received
    retries: int = 0  # calls repeated because the scaler was unavailable
    refusals: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, "CODE: details") of each


# What a platform repeats, with the same request id: the scaler away, too slow, or overloaded for a moment.
RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
ATTEMPTS = 20


@dataclass
class Driver:
    """Clients that each loop assign → hold → idle on a few functions until told to stop."""

    gateway: str
    keys: tuple[str, ...] = ("fa", "fb", "fc")
    clients: int = 6
    hold_s: float = 0.05
    timeout_s: float = 60
    retry_assign: bool = False  # repeat an Assign refused as unavailable, with the same request id
    function_timeout_s: int = 0  # the functions' timeout (their Meta's timeout_in_secs; 0: none given)
    attempts: int = ATTEMPTS  # tries of a call refused as unavailable, 0.25 s apart
    tag: str = ""  # prefix of request ids: drivers side by side must not share them
    tls: ClientTls | None = None  # over TLS (as a platform with a certificate would call), else in clear
    destroy: bool = False  # each Idle says the instance must go: every Assign is then a cold start
    # once told to stop, the instances held then are held until this is set (an Idle that comes after an event)
    release: asyncio.Event | None = None
    calls: list[Call] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with channel(self.gateway, self.tls) as ch:
            scaler = pb_grpc.ScalerStub(ch)
            await asyncio.gather(*(self._client(scaler, n) for n in range(self.clients)))

    def stop(self) -> None:
        self._stop.set()

    async def _client(self, scaler: pb_grpc.ScalerStub, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            call = Call(f"{self.tag}c{n}-{i}", self.keys[(n + i) % len(self.keys)])
            self.calls.append(call)
            await self.one(scaler, call)
            i += 1

    async def one(self, scaler: pb_grpc.ScalerStub, call: Call) -> None:
        meta = pb.Meta(key=call.key, runtime="python", memory_in_mb=128, timeout_in_secs=self.function_timeout_s)
        try:
            assign = pb.AssignRequest(request_id=call.request_id, meta_data=meta)
            reply = await self._retried(call, lambda: scaler.Assign(assign, timeout=self.timeout_s), self.retry_assign)
            if reply.status != pb.Ok:  # Throttle: the scaler's "not now", a refusal the caller must hear
                call.error = f"{pb.Status.Name(reply.status).upper()}: {reply.error_message}"
                call.failed_at = time.monotonic()
                return
            call.got_at, call.instance = time.monotonic(), reply.assigment.instance_id
            await asyncio.sleep(self.hold_s)
            if self.release is not None and self._stop.is_set():
                await self.release.wait()
            call.idle_at = time.monotonic()
            result = pb.Result(status_code=200, duration_in_ms=int(self.hold_s * 1000), need_destroy=self.destroy)
            idle = pb.IdleRequest(assigment=reply.assigment, result=result)
            await self._retried(call, lambda: scaler.Idle(idle, timeout=self.timeout_s), True)
            call.idled_at = time.monotonic()
        except grpc.aio.AioRpcError as e:
            call.error, call.failed_at = f"{e.code().name}: {e.details()}", time.monotonic()

    async def _retried(self, call: Call, attempt, retry: bool):
        """As a platform would: the same call again (same request id) while the scaler is unavailable."""
        attempts = self.attempts if retry else 1
        for n in range(attempts):
            try:
                return await attempt()
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY or n == attempts - 1:
                    raise
                call.retries += 1
                call.refusals.append((time.monotonic(), f"{e.code().name}: {e.details()}"))
                await asyncio.sleep(0.25)

    async def one_on(self, call: Call) -> None:
        """One call on a channel of its own, not counted in `calls`."""
        async with channel(self.gateway, self.tls) as ch:
            await self.one(pb_grpc.ScalerStub(ch), call)

    def overlaps(self) -> list[str]:
        return overlaps(self.calls)


def overlaps(calls: list[Call]) -> list[str]:
    """Instances handed to a request while an earlier holder had not yet let go."""
    held: dict[str, list[Call]] = {}
    for c in calls:
        if c.instance:
            held.setdefault(c.instance, []).append(c)
    out = []
    for instance, mine in held.items():
        mine.sort(key=lambda c: c.got_at)
        for a, b in itertools.pairwise(mine):
            if not a.idle_at or b.got_at <= a.idle_at:
                out.append(f"{instance}: {b.request_id} got it while {a.request_id} held it")
    return out


@dataclass
class TraceCallers:
    """A dataset's requests at their times, each by a caller that repeats its call (same request id) on
    UNAVAILABLE or DEADLINE_EXCEEDED for up to `patience_s`, as the README says is safe; then it holds
    the instance for the request's duration and calls Idle, repeated the same way."""

    gateway: str
    dataset: Dataset
    attempt_s: float = 10  # each call's deadline
    patience_s: float = 90
    calls: list[Call] = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)  # "<call> <code>" -> how often a repeat was needed

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        tag = secrets.token_hex(3)
        async with grpc.aio.insecure_channel(self.gateway) as channel:
            scaler = pb_grpc.ScalerStub(channel)
            tasks = []
            for n, r in enumerate(self.dataset.requests):
                await asyncio.sleep(max(0.0, begin + (r.start_time - self.dataset.start_ms) / 1000 - loop.time()))
                call = Call(f"{tag}-{n}", r.meta_key)
                self.calls.append(call)
                tasks.append(asyncio.create_task(self._one(scaler, call, r)))
            await asyncio.gather(*tasks)

    async def _one(self, scaler: pb_grpc.ScalerStub, call: Call, r: Request) -> None:
        m = self.dataset.metas[r.meta_key]
        meta = pb.Meta(
            key=r.meta_key, runtime=m.runtime, timeout_in_secs=m.timeout_in_secs, memory_in_mb=m.memory_in_mb
        )
        assign = pb.AssignRequest(request_id=call.request_id, meta_data=meta)
        try:
            reply = await self._repeated(call, "Assign", lambda: scaler.Assign(assign, timeout=self.attempt_s))
            call.got_at, call.instance = time.monotonic(), reply.assigment.instance_id
            await asyncio.sleep(r.durations_in_ms / 1000)
            call.idle_at = time.monotonic()
            dies = r.status_code != 200
            result = pb.Result(status_code=r.status_code, duration_in_ms=r.durations_in_ms, need_destroy=dies)
            idle = pb.IdleRequest(assigment=reply.assigment, result=result)
            await self._repeated(call, "Idle", lambda: scaler.Idle(idle, timeout=self.attempt_s))
        except grpc.aio.AioRpcError as e:
            call.error = f"{e.code().name}: {e.details()}"

    async def _repeated(self, call: Call, what: str, attempt):
        deadline = time.monotonic() + self.patience_s
        while True:
            try:
                return await attempt()
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY or time.monotonic() > deadline:
                    raise
                self.refusals[f"{what} {e.code().name}"] += 1
                call.retries += 1
                await asyncio.sleep(0.25)


async def controller_state(nats_url: str) -> state_service.Running:
    async with connected(nats_url, "test") as nc:
        return await state_service.fetch(nc)


def slots_of(states: dict[str, FnState]) -> set[str]:
    return {i.slot_id for s in states.values() for i in s.instances.values() if i.slot_id}


async def settled(
    nats_url: str, stub: PlatformStub, seconds: float = 90, killed_ms: int | None = None
) -> dict[str, FnState]:
    """Wait until nothing is being created or destroyed and the platform's slots are the state's.

    Up to a periodic reconcile (every 60 s) and then some: a slot whose CreateSlot a killed worker left under
    way is made after the take-over's reconcile listed the platform, and only the next one finds it.
    `killed_ms` (the stub's clock) when a platform worker was killed: see `dead_workers_slots`."""
    running = state_service.Running(seq=0, last_seq={}, states={})
    try:
        async with asyncio.timeout(seconds):
            while True:
                running = await controller_state(nats_url)
                if not _unsettled(running, stub, killed_ms):
                    return running.states
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not settled after {seconds:g}s: {_unsettled(running, stub, killed_ms)}") from None


async def held_once_settled(
    nats_url: str, stub: PlatformStub, seconds: float = 90, release_s: float = 10
) -> list[Instance]:
    """`settled`, then the instances still busy, looked for again for up to `release_s` while there are any: an
    Idle is answered before its release is stored, so the last ones answered may be on their way still, or retried
    through a store that only just came back. A release lost holds its instance until its function's timeout."""
    looked_until = time.monotonic() + release_s
    while True:
        states = await settled(nats_url, stub, seconds)
        held = [i for s in states.values() for i in s.instances.values() if i.phase is Phase.BUSY]
        if not held or time.monotonic() > looked_until:
            return held
        await asyncio.sleep(0.2)


def _unsettled(running: state_service.Running, stub: PlatformStub, killed_ms: int | None = None) -> str:
    """What keeps the state and the platform apart: partitions held and not loaded, instances still moving, slots
    only one of them has."""
    states = running.states
    moving = [
        f"{i.id} {i.phase.value}" for s in states.values() for i in s.instances.values()
        if i.phase in (Phase.CREATING, Phase.RETIRING)
    ]  # fmt: skip
    held, live = slots_of(states), set(stub.accounting.live)
    excused = dead_workers_slots(stub, killed_ms) if killed_ms is not None else set()
    only_state, only_platform = sorted(held - live), sorted(live - held - excused)
    said = [f"partitions not served: {running.unserved}"] if running.unserved else []
    said += [f"moving: {moving}"] if moving else []
    said += [f"slots only the state has: {only_state}"] if only_state else []
    said += [f"slots only the platform has: {_made_for(only_platform, stub)}"] if only_platform else []
    return "; ".join(said)


def dead_workers_slots(stub: PlatformStub, killed_ms: int) -> set[str]:
    """Slots asked for before a platform worker was killed at `killed_ms` and made again under the same request id
    after it: the killed worker had its answer (or the answer raced the kill) and never stored it, so the next
    worker made the slot again. On a platform that neither dedupes CreateSlot nor lists its slots (the
    challenge's) such a slot leaks, and nothing can name it (docs/faults.md, "What the platform must do")."""
    slots = stub.accounting.slots.values()
    again = {s.request_id for s in slots if s.created_ms >= killed_ms}
    return {s.id for s in slots if s.request_id in again and s.created_ms < killed_ms}


def _made_for(slots: list[str], stub: PlatformStub) -> str:
    """Each slot's CreateSlot request id, and the slots made again for that id: a CreateSlot answered to a worker
    that died before storing it, then repeated by the next (a leak the platform must prevent, docs/faults.md)."""
    said = []
    for slot in slots:
        request = stub.accounting.live[slot].request_id
        again = [s.id for s in stub.accounting.slots.values() if s.request_id == request and s.id != slot]
        said.append(f"{slot} made for {request}" + (f", made again as {', '.join(again)}" if again else ""))
    return "; ".join(said)
