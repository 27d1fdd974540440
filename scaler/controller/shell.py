"""The controller: the single writer of the functions of the partitions it leases.

It puts the parts together and runs them: commands come in at the door (path/door.py: routed, admitted
once), go down their function's lane (path/lanes.py, path/lane.py: decided by the pure core, stored
through the writer, answered, planned), and their replies go out through one owner (path/replies.py):
the command path, whose package follows a call through it. Around that: which partitions the node
serves (partitions.py, leases.py), what it does as they come and go and when the store lost batches
(recovery.py), the snapshots kept ahead of retention (snapshotter.py), each function's deadlines
(path/timers.py), and the run's totals shared across nodes (shared.py, returns.py).
"""

import asyncio
import logging
import secrets
import socket
import time
from dataclasses import dataclass

from scaler.controller import membership, state_service
from scaler.controller.core.limits import NO_LIMITS, Limits, TenantQuota
from scaler.controller.core.policy import Capability, Policy
from scaler.controller.core.state import FnState
from scaler.controller.core.totals import Totals
from scaler.controller.leases import EVERY_S, TTL_S, ranges
from scaler.controller.ledger import Ledger
from scaler.controller.partitions import NotServing, Partitions
from scaler.controller.path.admission import MAX_BACKLOG, MAX_BEHIND_S, Admission
from scaler.controller.path.door import Door
from scaler.controller.path.lane import Lane
from scaler.controller.path.lanes import STORE_WAIT_S, Lanes
from scaler.controller.path.replies import Replies
from scaler.controller.path.timers import Timers
from scaler.controller.path.writer import Writer
from scaler.controller.recovery import Recovery
from scaler.controller.returns import Returns
from scaler.controller.shared import SharedTotals
from scaler.controller.snapshots import Snapshot, SnapshotStore
from scaler.controller.snapshotter import GUARD_EVERY_S, SNAPSHOT_EVERY, SNAPSHOT_INTERVAL_S, Snapshotter
from scaler.controller.tenants import TenantQuotas
from scaler.proto.commands import Admin, AnyCommand, Assign, Idle, Reply
from scaler.proto.subjects import PARTITIONS, partition
from scaler.runtime import durability
from scaler.runtime.bus import close, connect, while_connected
from scaler.runtime.clock import Clock
from scaler.runtime.forward import Forwarder
from scaler.runtime.tasks import cancelled
from scaler.runtime.text import plural
from scaler.store import DEFAULT_RETENTION, EventStore, Retention

__all__ = ["GUARD_EVERY_S", "MAX_BACKLOG", "MAX_BEHIND_S", "STORE_WAIT_S", "Controller", "NotServing"]

log = logging.getLogger("scaler.controller")


@dataclass(frozen=True)
class Settings:
    replicas: int = 0  # 0: as durability.default_replicas says (3 on a cluster)
    lease_ttl_s: float = TTL_S
    lease_every_s: float = EVERY_S
    snapshot_every: int = SNAPSHOT_EVERY
    snapshot_interval_s: float = SNAPSHOT_INTERVAL_S
    limits: Limits = NO_LIMITS
    retention: Retention = DEFAULT_RETENTION  # set on the stream at start; what the snapshots must keep ahead of
    guard_every_s: float = GUARD_EVERY_S
    nats_monitor: str = ""  # where to ask whether NATS syncs every write
    nats_unsynced: bool = False  # ... and not syncing is intended: no warning
    store_wait_s: float = STORE_WAIT_S  # a call waits this long for a store that does not answer, then UNAVAILABLE


class Controller:
    def __init__(
        self,
        nats_url: str,
        policy: Policy,
        clock: Clock | None = None,
        node: str = "",
        max_backlog: int = MAX_BACKLOG,
        max_behind_s: float = MAX_BEHIND_S,
        **settings,
    ) -> None:
        self.nats_url = nats_url
        self.policy = policy
        self.clock = clock or Clock()
        self.node = node or f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self.settings = Settings(**settings)
        self.replicas = self.settings.replicas
        self.sync = durability.Sync.UNKNOWN
        self.reclaim_leases = False  # `node` is held by this process alone: take its earlier incarnation's leases
        self.admission = Admission(max_backlog, max_behind_s)
        self.ledger = Ledger()
        self.timers = Timers(self.clock, lambda key, due: self.lanes.tick(key, due))
        self.writer: Writer | None = None
        self.snapshots: Snapshotter | None = None
        self.partitions: Partitions | None = None
        self.recovery: Recovery | None = None
        self.lanes: Lanes | None = None
        self.door: Door | None = None
        self.address = ""  # where callers reach its gRPC port, when it has one (its heartbeat says it: `scaler nodes`)
        self.started_ms = 0
        self.tenants: TenantQuotas | None = None
        self._parts: list = []  # started after the partitions' first load, stopped before NATS closes
        self._lag_watch: asyncio.Task | None = None
        self._nc = None

    # What tests, metrics and tools read.
    @property
    def states(self) -> dict[str, FnState]:
        return self.ledger.states

    @property
    def totals(self) -> Totals:
        return self.ledger.totals

    @property
    def leases(self):
        return self.partitions.leases if self.partitions is not None else None

    @property
    def loaded_batches(self) -> int:
        return self.partitions.loaded_batches if self.partitions is not None else 0

    @property
    def serving(self) -> set[int]:
        return self.partitions.serving if self.partitions is not None else set()

    @property
    def losses(self) -> int:
        return self.recovery.losses if self.recovery is not None else 0

    @property
    def unreconciled(self) -> int:
        return self.recovery.unreconciled if self.recovery is not None else 0

    @property
    def snapshot_saved_s(self) -> float | None:
        return self.snapshots.saved_s if self.snapshots is not None else None

    def trouble(self) -> str:
        """Why this node cannot serve its functions now ("" when it can): NATS away, its partitions being reloaded
        after a loss, loading, or refused. What its /healthz says, besides the event store's own health."""
        if self._nc is None or not self._nc.is_connected:
            return "the controller is not connected to NATS"
        if self.recovery is not None and self.recovery.reloading:
            return f"the controller is reloading its partitions: {self.recovery.reloading}"
        if self.partitions is not None and (held := sorted(self.partitions.loading)):
            return f"the controller is loading partitions {ranges(held)}"
        if self.partitions is not None and self.partitions.refused:
            return f"the controller refuses partitions {ranges(sorted(self.partitions.refused))}"
        return ""

    def serves(self, key: str) -> bool:
        return partition(key) in self.serving

    def snapshot(self, partitions: set[int] | None = None) -> Snapshot:
        return self.snapshots.snapshot(partitions)

    async def call(self, cmd: Assign | Idle | Admin, timeout_s: float | None) -> Reply:
        """Decide a call from this process and wait for its answer (the gateway's Router)."""
        return await self.door.call(cmd, timeout_s)

    async def handle(self, cmd: AnyCommand):
        """Decide one command and wait until it is stored."""
        return await self.door.handle(cmd)

    async def functions(self, key: str = "") -> dict[str, FnState]:
        """Every function the running controllers hold (scaler.Admin/List), asked of each over NATS; with `key`,
        that one alone, asked of the node that owns it."""
        if not key:
            return (await state_service.fetch(self._nc)).states
        running = await state_service.fetch(self._nc, serve_s=5.0, partitions={partition(key)})
        return {k: s for k, s in running.states.items() if k == key}

    async def nodes(self) -> list[membership.Member]:
        """The running nodes, the partitions each holds and how long ago each lease was renewed (`scaler nodes`)."""
        return await membership.members(self._nc.jetstream())

    async def others_up(self) -> list[str]:
        """The other nodes alive, by their heartbeats."""
        return await self.partitions.leases.others()

    def quotas(self) -> tuple[dict[str, TenantQuota], Totals]:
        """The tenants' quotas, and the run's totals (what each tenant holds on every node, as last heard)."""
        return self.ledger.tenants(), self.ledger.run_totals()

    async def set_quota(self, tenant: str, quota: TenantQuota | None) -> None:
        """Set a tenant's quota for every node (None: the limits file's again)."""
        await self.tenants.set(tenant, quota)

    async def start(self) -> str:
        s = self.settings
        self._nc = await connect(self.nats_url, f"controller {self.node}", buffered=False)  # nothing sent late
        events = EventStore(self._nc, writer=self.node)
        self.replicas = s.replicas or durability.default_replicas(self._nc)
        monitors = durability.monitor_urls(self.nats_url, s.nats_monitor)
        self.sync = await durability.server_sync(monitors)
        durability.warn(self.sync, monitors, s.nats_unsynced)
        await events.ensure(self.replicas, s.retention)
        store = SnapshotStore(events.js, self.replicas)
        await store.open()
        serving: set[int] = set()  # the partitions loaded and answered here: Partitions keeps it
        self.writer = Writer(events, self.ledger, self._writes)
        self.snapshots = Snapshotter(
            events, store, self.ledger, self.clock, s.retention, serving, self.writer.floor,
            lambda p, tenure: self.partitions.leases.confirm(p, tenure), lambda p: self.partitions.leases.tenure.get(p),
            lambda why: self.recovery.lost(why), await events.incarnation(), s.snapshot_every, s.snapshot_interval_s,
            s.guard_every_s,
        )  # fmt: skip
        replies = Replies()
        await replies.start(self._nc)
        lane = Lane(self.ledger, self.writer, self.policy, self.clock, self._fence, self.snapshots, replies.send)
        self.recovery = Recovery(
            self._nc, events, self.replicas, s.retention, self.ledger, lane, replies, self.timers, self.writer,
            self.snapshots,
        )  # fmt: skip
        self.partitions = Partitions(
            self._nc, events, self.ledger, store, self.snapshots, serving, self._on_request, self._on_report,
            self.recovery.served, self.recovery.released, self.node, s.limits, s.lease_ttl_s, s.lease_every_s,
            self.replicas, reclaim=self.reclaim_leases, clock=self.clock,
        )  # fmt: skip
        self.recovery.partitions = self.partitions
        self.started_ms = time.time_ns() // 1_000_000
        self.partitions.leases.about = lambda: membership.about(self.address, self.started_ms, self.policy.name)
        returns = Returns(self._nc, self.node, self.ledger, self.clock, lambda cues: self.lanes.cue(cues))
        returns = returns if self.policy.can(Capability.FOLLOWS_LEADERS) else None
        self.lanes = Lanes(
            lane, replies, self.timers, self.admission, self.partitions, returns, self.recovery.lost, s.store_wait_s
        )
        forwarder = Forwarder.over(self._nc)
        self.door = Door(
            self._nc, self.node, self.lanes, replies, self.partitions, self.admission, self.writer, forwarder
        )
        await forwarder.start()
        self.timers.start()
        self._lag_watch = asyncio.create_task(self._watch_lag())
        shared = SharedTotals(self._nc, self.node, self.ledger, s.lease_ttl_s, s.lease_every_s)
        state = state_service.Serving(self._nc, self.node, self.snapshot, serving)
        self.tenants = TenantQuotas(self._nc, self.ledger, self.replicas)
        self._parts = [p for p in (shared, returns, state, self.tenants) if p is not None]
        for part in self._parts:
            await part.start()
        self.snapshots.start()
        await self.partitions.start()
        return self._ready_line()

    def _fence(self, p: int) -> None:
        self.partitions.check(p)

    def _writes(self, key: str) -> bool:
        """Whether this node may still send a batch of `key` it decided (within the lease's renewal deadline): its
        partition's lease held and not yet lapsed at the server. One being given up stores what it decided until
        its release is done (Writer.forget)."""
        return self.partitions.leases.sendable(partition(key))

    async def _on_request(self, msg) -> None:
        await self.door.on_request(msg)

    async def _on_report(self, msg) -> None:
        await self.door.on_report(msg)

    def _ready_line(self) -> str:
        functions, batches = plural(len(self.states), "function"), plural(self.loaded_batches, "batch", "batches")
        refused = self.partitions.refused
        refusing = f", REFUSING partitions {ranges(sorted(refused))} (see the error above)" if refused else ""
        return (
            f"controller {self.node} ({self.policy.name} policy, {len(self.serving)} of {PARTITIONS} partitions"
            f"{refusing}, {functions}, {batches} read; {durability.describe(self.sync, self.replicas)})"
        )

    async def drain(self) -> str:
        """Hand this node's partitions to the other nodes before it stops (SIGTERM, `scaler drain`): each
        snapshotted at the newest watermark while still leased, then freed; none taken again. The gateway
        still serves meanwhile, passing calls on to the new owners. Returns what became of them."""
        if self.partitions is None:
            return f"{self.node} is not running"
        said: list[str] = []

        async def hand_over() -> None:
            await self.snapshots.stop()
            said.append(await self.partitions.leases.drain())

        # NATS gone (an embedded one stopped with us): nobody can take a partition over, nor see one freed
        if not await while_connected(self._nc, hand_over(), "handing its partitions over; their leases lapse"):
            return f"{self.node}: NATS is away, no hand-over; its leases lapse"
        log.info("drained: %s", said[0])
        return said[0]

    async def stop(self) -> None:
        if self.snapshots is not None:
            await self.snapshots.stop()  # its last look at the stream waits 1 s at most
        await while_connected(self._nc, self._give_back(), "snapshots; its leases lapse")
        await self.timers.stop()
        await cancelled(self._lag_watch)
        if self.recovery is not None:
            await self.recovery.stop()
        if self.door is not None:
            await self.door.forwarder.stop()
        if self.lanes is not None:
            await self.lanes.stop(connected=self._nc is not None and self._nc.is_connected)
        await close(self._nc)

    async def _give_back(self) -> None:
        if self.partitions is not None:
            await self.partitions.stop()  # gives every partition back, each snapshotted
        for part in self._parts:
            await part.stop()

    async def _watch_lag(self) -> None:
        loop, every_s = asyncio.get_running_loop(), self.admission.watch_every_s
        try:
            while True:
                began = loop.time()
                await asyncio.sleep(every_s)
                self.admission.lagged(loop.time() - began - every_s)
        finally:
            self.admission.unwatched()  # stopped, not quiet
