"""The whole scaler on loopback, in this process: real nats-server, real gRPC, the real stub.

The node (controller + gRPC gateway) and both workers, as `scaler up` runs them, but as objects a
test can reach into."""

import asyncio
from dataclasses import dataclass, field

import grpc

from scaler.controller.core.limits import NO_LIMITS, Limits
from scaler.controller.core.policy import get_policy
from scaler.controller.leases import EVERY_S, TTL_S
from scaler.controller.shell import GUARD_EVERY_S, STORE_WAIT_S, Controller
from scaler.gateway.server import Gateway
from scaler.platform_stub.server import Faults, PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.clock import Clock
from scaler.simulator.dataset import FunctionMeta
from scaler.store.config import DEFAULT_RETENTION, Retention
from scaler.workers.gc import RECONCILE_GRACE_S, GcWorker
from scaler.workers.platform import PlatformWorker


async def eventually(condition, seconds: float = 10.0) -> None:
    """Wait until `condition()` holds: the effect of another component, observed by polling."""
    async with asyncio.timeout(seconds):
        while True:
            if condition():
                return
            await asyncio.sleep(0.02)


@dataclass
class Stack:
    nats_url: str
    metas: dict[str, FunctionMeta] = field(default_factory=dict)
    policy: str = "demo"
    clock: Clock = field(default_factory=Clock)
    faults: Faults = field(default_factory=Faults)
    create_latency_ms: int = 20
    limits: Limits = NO_LIMITS
    retention: Retention = DEFAULT_RETENTION
    guard_every_s: float = GUARD_EVERY_S
    reconcile_grace_s: float = RECONCILE_GRACE_S
    lease_ttl_s: float = TTL_S
    lease_every_s: float = EVERY_S
    store_wait_s: float = STORE_WAIT_S
    like_challenge: bool = False  # the stub as the challenge's platform: a new slot per CreateSlot, no list
    nats_monitor: str = ""  # the nats-server's monitoring, so the controller can tell it syncs every write

    async def __aenter__(self) -> "Stack":
        latency, challenge = self.create_latency_ms, self.like_challenge
        self.stub = PlatformStub("127.0.0.1:0", self.metas, latency, self.clock, self.faults, challenge)
        await self.stub.start()
        platform = f"127.0.0.1:{self.stub.port}"
        self.controller = Controller(
            self.nats_url,
            get_policy(self.policy),
            self.clock,
            limits=self.limits,
            retention=self.retention,
            guard_every_s=self.guard_every_s,
            lease_ttl_s=self.lease_ttl_s,
            lease_every_s=self.lease_every_s,
            store_wait_s=self.store_wait_s,
            nats_monitor=self.nats_monitor,
        )
        self.gateway = Gateway(self.controller, "127.0.0.1:0", reply_timeout_s=30)  # the node: one process
        self.platform_worker = PlatformWorker(self.nats_url, platform)
        self.gc_worker = GcWorker(self.nats_url, platform, self.clock, reconcile_grace_s=self.reconcile_grace_s)
        self.parts = [self.controller, self.gateway, self.platform_worker, self.gc_worker]
        for part in self.parts:
            await part.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.gateway.port}")
        self.scaler = pb_grpc.ScalerStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        for part in reversed(self.parts):
            await part.stop()
        await self.stub.stop()

    async def assign(self, request_id: str, key: str = "fn", memory_mb: int = 256, session: str = "") -> pb.AssignReply:
        meta = pb.Meta(key=key, runtime="python", timeout_in_secs=60, memory_in_mb=memory_mb)
        metadata = (("scaler-session", session),) if session else None
        request = pb.AssignRequest(request_id=request_id, meta_data=meta)
        return await self.scaler.Assign(request, timeout=30, metadata=metadata)

    async def idle(self, reply: pb.AssignReply, need_destroy: bool = False, **assignment) -> pb.IdleReply:
        a = pb.Assignment(
            request_id=assignment.get("request_id", reply.assigment.request_id),
            meta_key=assignment.get("meta_key", reply.assigment.meta_key),
            instance_id=assignment.get("instance_id", reply.assigment.instance_id),
        )
        result = pb.Result(status_code=200, duration_in_ms=10, need_destroy=need_destroy)
        return await self.scaler.Idle(pb.IdleRequest(assigment=a, result=result), timeout=30)

    async def settled(self) -> None:
        """Wait until nothing is being decided (an Idle is answered before its release is stored), every retired
        instance's slot is destroyed and nothing is being created."""
        await eventually(
            lambda: (
                not self.controller.lanes.busy
                and all(
                    i.phase.value in ("idle", "busy")
                    for s in self.controller.states.values()
                    for i in s.instances.values()
                )
            )
        )

    def live_instances(self) -> dict[str, str]:
        """instance id -> slot id, for every instance the controller's state holds."""
        return {i.id: i.slot_id for s in self.controller.states.values() for i in s.instances.values()}
