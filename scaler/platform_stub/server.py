"""A stand-in for the platform's `Platform` service, with exact slot accounting.

CreateSlot takes a fixed latency, Init the function's initDurationInMs from the metas (the
Init request carries no init time), both on the component clock so a simulation can run them
faster. Accounting (live slots, slot GB·s) is served by the PlatformAdmin service.

A worker killed during CreateSlot (or its connection reset) leaves a slot the scaler never heard
of. A platform keeps that from leaking in one of three ways, and the stub's modes (`MODES`) play
each, alone or together, so each can be tested (docs/faults.md, "What the platform must do"):
- `dedupes`: calls are idempotent per request id: the worker's repeated CreateSlot (same request
  id) gets the same slot back, a repeated Init joins the one under way;
- `tears_down`: a CreateSlot whose caller goes away before the answer is torn down: the slot is
  billed from the call to that moment and never handed to anyone (the challenge's platform ran
  CreateSlot within the call, so a cancelled call created nothing: mode `challenge`);
- `lists`: PlatformAdmin.ListSlots lets the gc worker reconcile: it finds the slot and destroys it.
`kind` (the default) dedupes and lists; `challenge` behaves as the challenge's platform did, which
is what the scaler must survive: every CreateSlot creates a new slot, a second Init on a slot fails,
no PlatformAdmin, and a cancelled CreateSlot torn down; `dedupe` and `list` do that one alone; `bare`
does none of the three: there a killed worker's slot leaks, and nothing can name it. Without
`dedupes` a second Init on a slot fails.
An Init whose caller goes away runs to its end (the slot exists and is billed anyway).
"""

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from scaler.proto import platform_admin_pb2 as admin
from scaler.proto import platform_admin_pb2_grpc as admin_grpc
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.clock import Clock
from scaler.runtime.ports import bind, grpc_server
from scaler.runtime.text import plural
from scaler.runtime.tls import ServerTls
from scaler.simulator.dataset import FunctionMeta

log = logging.getLogger("scaler.platform_stub")

DEFAULT_INIT_MS = 100  # for a function the metas don't list


@dataclass
class SlotRecord:
    """One slot's life, in clock ms; kept after DestroySlot so a run can be accounted per function."""

    id: str
    memory_mb: int
    created_ms: int  # CreateSlot arrived: the slot costs from here
    request_id: str
    created_done_ms: int = 0
    key: str = ""  # the function whose instance it runs, once Init arrived
    instance_id: str = ""
    init_started_ms: int = 0
    ready_ms: int = 0  # Init finished
    destroyed_ms: int | None = None
    init_done: asyncio.Future[pb.InitReply] | None = None  # the Init under way or done

    @property
    def ready(self) -> bool:
        """Init finished on it."""
        done = self.init_done
        return done is not None and done.done() and not done.cancelled() and done.exception() is None

    def gb_s(self, now_ms: int) -> float:
        end = now_ms if self.destroyed_ms is None else self.destroyed_ms
        return self.memory_mb / 1024 * (end - self.created_ms) / 1000


@dataclass(frozen=True)
class Refusal:
    """An answer other than Ok, for a fault to give: the challenge's statuses (Throttle: try again later), or
    with `dropped`, no answer at all: the call ends with that gRPC code, as a reset stream or a stopping
    server ends it."""

    message: str
    status: int = pb.InternalError
    dropped: grpc.StatusCode | None = None


Fault = Callable[[Any], str | Refusal | None]  # a message (InternalError), a Refusal, or None to go ahead


@dataclass
class Faults:
    """Failures to inject, for tests: each returns how to refuse the call, or None to serve it; and what to do as a
    call's OK answer goes out (`created`, `inited`: a fault that kills the caller before it records the answer)."""

    create: Fault = lambda _: None
    init: Fault = lambda _: None
    created: Callable[[pb.CreateSlotRequest, pb.Slot], None] = lambda *_: None
    inited: Callable[[pb.InitRequest], None] = lambda _: None


def _refusal(fault: str | Refusal | None) -> Refusal | None:
    return Refusal(fault) if isinstance(fault, str) else fault


@dataclass(frozen=True)
class Mode:
    """What the platform does that keeps a slot made for a vanished caller from leaking (see the module's doc)."""

    dedupes: bool
    tears_down: bool
    lists: bool


MODES = {
    "kind": Mode(dedupes=True, tears_down=False, lists=True),
    "challenge": Mode(dedupes=False, tears_down=True, lists=False),
    "dedupe": Mode(dedupes=True, tears_down=False, lists=False),
    "list": Mode(dedupes=False, tears_down=False, lists=True),
    "bare": Mode(dedupes=False, tears_down=False, lists=False),
}


@dataclass
class Accounting:
    slots: dict[str, SlotRecord] = field(default_factory=dict)  # every slot ever created
    live: dict[str, SlotRecord] = field(default_factory=dict)
    inits: int = 0
    init_calls: list[tuple[str, str]] = field(default_factory=list)  # (slot, instance) of every Init received
    refused_inits: list[str] = field(default_factory=list)  # a second Init on a slot, refused: the platform's error

    @property
    def created(self) -> int:
        return len(self.slots)

    @property
    def destroyed(self) -> int:
        return len(self.slots) - len(self.live)

    def gb_s(self, now_ms: int) -> float:
        return sum(s.gb_s(now_ms) for s in self.slots.values())

    def gb_s_by_key(self, now_ms: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.slots.values():
            out[s.key] = out.get(s.key, 0.0) + s.gb_s(now_ms)
        return out


class PlatformStub(pb_grpc.PlatformServicer, admin_grpc.PlatformAdminServicer):
    def __init__(
        self,
        listen: str = "127.0.0.1:50051",
        metas: dict[str, FunctionMeta] | None = None,
        create_latency_ms: int = 100,
        clock: Clock | None = None,
        faults: Faults | None = None,
        like_challenge: bool = False,
        mode: Mode | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.listen = listen
        self.tls = tls  # serve TLS (scaler/runtime/tls.py): the workers then need --platform-ca
        self.metas = metas or {}
        self.create_latency_ms = create_latency_ms
        self.clock = clock or Clock()
        self.faults = faults or Faults()
        self.mode = mode or MODES["challenge" if like_challenge else "kind"]  # like_challenge: the same as "challenge"
        self.accounting = Accounting()
        self.port = 0
        self._by_request: dict[str, SlotRecord] = {}
        self._ids = itertools.count(1)
        self._run = secrets.token_hex(3)  # slot ids never repeat across stub restarts
        self._server: grpc.aio.Server | None = None

    async def start(self) -> str:
        self._server = grpc_server()
        pb_grpc.add_PlatformServicer_to_server(self, self._server)
        if self.mode.lists:
            admin_grpc.add_PlatformAdminServicer_to_server(self, self._server)
        self.port = bind(self._server, self.listen, self.tls)
        await self._server.start()
        host = self.listen.rsplit(":", 1)[0]
        mode = next((f", mode {name}" for name, m in MODES.items() if m == self.mode and name != "kind"), "")
        mode += ", TLS" if self.tls is not None else ""
        return f"platform stub on {host}:{self.port} ({plural(len(self.metas), 'function')} in metas{mode})"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1)

    async def CreateSlot(self, request: pb.CreateSlotRequest, context) -> pb.CreateSlotReply:
        memory = request.resource_config.memory_in_megabytes
        if memory == 0:
            return pb.CreateSlotReply(status=pb.InvalidArgument, error_message="memory_in_megabytes must be positive")
        known = self._by_request.get(request.request_id) if request.request_id and self.mode.dedupes else None
        if known is not None and known.id in self.accounting.live:
            return pb.CreateSlotReply(status=pb.Ok, slot=self._slot(known))
        if refused := _refusal(self.faults.create(request)):
            if refused.dropped is not None:
                await context.abort(refused.dropped, refused.message)
            return pb.CreateSlotReply(status=refused.status, error_message=refused.message)
        # The slot costs from the moment it is asked for: creation time is slot time too.
        record = SlotRecord(
            id=f"slot-{self._run}-{next(self._ids)}",
            memory_mb=memory,
            created_ms=self.clock.now_ms(),
            request_id=request.request_id,
        )
        self.accounting.slots[record.id] = self.accounting.live[record.id] = record
        if request.request_id:
            self._by_request[request.request_id] = record
        try:
            await self.clock.sleep_ms(self.create_latency_ms)
        except asyncio.CancelledError:
            if self.mode.tears_down:  # its caller went away: without this, nobody would ever know this slot
                self._tear_down(record)
            raise
        record.created_done_ms = self.clock.now_ms()
        slot = self._slot(record)
        self.faults.created(request, slot)
        return pb.CreateSlotReply(status=pb.Ok, slot=slot)

    def _slot(self, record: SlotRecord) -> pb.Slot:
        return pb.Slot(
            id=record.id,
            resource_config=pb.ResourceConfig(memory_in_megabytes=record.memory_mb),
            create_time=record.created_ms,
            create_duration_in_ms=self.create_latency_ms,
        )

    async def Init(self, request: pb.InitRequest, context) -> pb.InitReply:
        self.accounting.init_calls.append((request.slot_id, request.instance_id))
        record = self.accounting.live.get(request.slot_id)
        if record is None:
            return pb.InitReply(status=pb.NotFound, error_message=f"no slot {request.slot_id!r}")
        if record.instance_id == request.instance_id and record.init_done is not None and self.mode.dedupes:
            return await asyncio.shield(record.init_done)  # a retried Init, finished or still running
        if record.instance_id:
            message = f"slot {record.id} already runs instance {record.instance_id}"
            self.accounting.refused_inits.append(f"{message} (asked for {request.instance_id})")
            return pb.InitReply(status=pb.InvalidArgument, error_message=message)
        if refused := _refusal(self.faults.init(request)):
            return pb.InitReply(status=refused.status, error_message=refused.message)
        record.instance_id = request.instance_id
        record.key = request.meta_data.key
        # Init runs to its end even if this caller goes away: a retry (a restarted worker) joins it.
        record.init_done = asyncio.ensure_future(self._init(record, request))
        return await asyncio.shield(record.init_done)

    async def _init(self, record: SlotRecord, request: pb.InitRequest) -> pb.InitReply:
        meta = self.metas.get(record.key)
        init_ms = meta.init_duration_in_ms if meta else DEFAULT_INIT_MS
        started = record.init_started_ms = self.clock.now_ms()
        await self.clock.sleep_ms(init_ms)
        record.ready_ms = self.clock.now_ms()
        self.accounting.inits += 1
        self.faults.inited(request)
        return pb.InitReply(status=pb.Ok, create_time=started, init_duration_in_ms=init_ms)

    async def DestroySlot(self, request: pb.DestroySlotRequest, context) -> pb.DestroySlotReply:
        record = self.accounting.live.get(request.id)
        if record is None:
            return pb.DestroySlotReply(status=pb.NotFound, error_message=f"no slot {request.id!r}")
        self._tear_down(record)
        return pb.DestroySlotReply(status=pb.Ok)

    def _tear_down(self, record: SlotRecord) -> None:
        self.accounting.live.pop(record.id, None)
        record.destroyed_ms = self.clock.now_ms()

    async def Stats(self, request: admin.StatsRequest, context) -> admin.StatsReply:
        a = self.accounting
        return admin.StatsReply(
            live_slots=len(a.live),
            slots_created=a.created,
            slots_destroyed=a.destroyed,
            inits=a.inits,
            slot_gb_seconds=a.gb_s(self.clock.now_ms()),
            live_memory_mb=sum(s.memory_mb for s in a.live.values()),
        )

    async def ListSlots(self, request: admin.ListSlotsRequest, context) -> admin.ListSlotsReply:
        slots = [
            admin.SlotInfo(
                id=s.id,
                memory_in_mb=s.memory_mb,
                instance_id=s.instance_id,
                create_time=s.created_ms,
                request_id=s.request_id,
                ready=s.ready,
            )
            for s in self.accounting.live.values()
        ]
        return admin.ListSlotsReply(slots=slots)
