"""Destroys retired instances' slots, and reconciles the state with the platform's list while it runs.

Reconcile: from its start it waits in the background for the platform (the documented order
starts the scaler before the simulator that serves the platform), lists the platform's live slots
(PlatformAdmin.ListSlots, which the challenge's platform lacks: then it says so once and skips)
and sends each partition's owner the slots whose instances belong to its functions; each
function's core drops instances whose slot is gone and retires slots it does not know. Then again
every `reconcile_every_s`, and whenever a node asks (`reconcile.ask`: it took partitions over, or
found events lost); one gc worker of the queue group answers each ask. The reconcile is safe
whenever it comes: what may be in flight when the list is taken is left alone.
"""

import asyncio
import contextlib
import logging

import grpc

from scaler.proto import platform_admin_pb2 as admin
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.commands import AnyCommand, PlatformSlot, Reconcile, SlotDestroyed, owner
from scaler.proto.events import Batch, Event, InstanceDestroyed, InstanceRetired, destroys
from scaler.proto.platform_admin_pb2_grpc import PlatformAdminStub
from scaler.proto.subjects import PARTITIONS, RECONCILE_ASK, REPORT, SYSTEM_KEY, UNLISTED, function_events, partition
from scaler.runtime.access import Nats
from scaler.runtime.bus import send
from scaler.runtime.clock import Clock
from scaler.runtime.tasks import cancelled
from scaler.store import stream
from scaler.workers.effects import ACK_WAIT_S, Delivery, EffectWorker, PlatformError, call_platform

log = logging.getLogger("scaler.gc_worker")

RECONCILE_GRACE_S = 30.0  # a slot younger than this may be one being created right now
RECONCILE_EVERY_S = 60.0
ASK_WAIT_S = 5.0  # how long an ask waits for the first reconcile to tell whether the platform lists its slots


class GcWorker(EffectWorker):
    durable = "gc-worker"
    name = "gc worker"
    effect = "d"

    def __init__(
        self,
        nats_url: Nats,
        platform: str,
        clock: Clock | None = None,
        concurrency: int = 1024,
        reconcile_grace_s: float = RECONCILE_GRACE_S,
        ack_wait_s: float = ACK_WAIT_S,
        reconcile_every_s: float = RECONCILE_EVERY_S,
    ) -> None:
        super().__init__(nats_url, platform, concurrency, ack_wait_s)
        self.clock = clock or Clock()
        self.reconcile_grace_s = reconcile_grace_s
        self.reconcile_every_s = reconcile_every_s
        self.reconciled: asyncio.Task[int | None] | None = None  # the platform's slot count, once reconciled
        self.lists = True  # the platform lists its slots (until it says it cannot)
        self._again: asyncio.Task | None = None  # the periodic reconcile, and the asked ones
        self._asked = asyncio.Event()

    def wants(self, event: Event) -> bool:
        return destroys(event)

    async def act(self, key: str, event: InstanceRetired, delivery: Delivery) -> AnyCommand | None:
        if delivery.redelivered and await self._destroyed(key, event.instance_id, delivery.seq):
            return None  # done and reported before: its batch's ack was lost (a worker or NATS restarted)
        request_id = f"destroy:{event.instance_id}"
        request = pb.DestroySlotRequest(request_id=request_id, id=event.slot_id, reason=event.reason)
        destroy = self.platform.DestroySlot
        reply = await call_platform(destroy, request, "DestroySlot", self.patience_s, self.platform_addr)
        if reply.status not in (pb.Ok, pb.NotFound):  # NotFound: already gone, which is what we want
            raise PlatformError(f"DestroySlot {event.slot_id}: {pb.Status.Name(reply.status)}: {reply.error_message}")
        return SlotDestroyed(key=key, instance_id=event.instance_id, slot_id=event.slot_id)

    async def _destroyed(self, key: str, instance_id: str, seq: int) -> bool:
        """Whether the function's events after the retirement (at `seq`) record the instance's slot destroyed."""
        found = False

        def look(_: int, batch: Batch) -> bool:
            nonlocal found
            found = any(isinstance(e, InstanceDestroyed) and e.instance_id == instance_id for e in batch.events)
            return found

        await stream.read(self._js, look, function_events(key), after_seq=seq)
        return found

    async def start(self) -> str:
        what = await super().start()
        self.reconciled = asyncio.create_task(self._reconcile_when_there())
        await self._nc.subscribe(RECONCILE_ASK, queue=self.durable, cb=self._on_ask)
        self._again = asyncio.create_task(self._reconcile_again())
        return f"{what}, reconciling once the platform answers"

    async def stop(self) -> None:
        await cancelled(self.reconciled, self._again)
        await super().stop()

    async def _on_ask(self, msg) -> None:
        """A node asks: reconcile soon; the answer says whether the platform can be reconciled at all."""
        self._asked.set()
        if self.reconciled is not None and not self.reconciled.done():  # not known yet: the first reconcile tells
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.reconciled), ASK_WAIT_S)
        await msg.respond(b"" if self.lists else UNLISTED)

    async def _reconcile_again(self) -> None:
        """After the first reconcile: every `reconcile_every_s`, and at once when a node asks."""
        await asyncio.shield(self.reconciled)
        while self.lists:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._asked.wait(), self.reconcile_every_s)
            try:
                await self.reconcile()
            except Exception as e:  # the platform or NATS away: the next round tries again
                log.debug("reconcile failed: %s", e)

    async def _reconcile_when_there(self) -> int | None:
        """Reconcile as soon as the platform answers, however long that takes; a failure after it answered
        (it went away again) is said once and tried again."""
        delay, said = 1.0, False
        while True:
            await self._channel.channel_ready()  # the list is taken when it answers, not when we began to wait
            try:
                slots = await self.reconcile(wait_for_ready=True)
            except grpc.aio.AioRpcError as e:
                if not said:
                    why = f"{e.code().name}: {e.details()}"
                    log.warning("could not list the platform's slots (%s); trying again", why)
                    said = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            if slots is not None:
                log.info("reconciled with the platform: %d live slots", slots)
            return slots

    async def reconcile(self, wait_for_ready: bool = False) -> int | None:
        """Send each partition the platform's live slots of its functions; None when the platform cannot list them.

        With `wait_for_ready`, a platform not connected yet is waited for (within the call's 30 s).
        """
        self._asked.clear()  # an ask made before this list is answered by it; one made during it, by the next
        listed_ms = self.clock.now_ms()  # before the call: a slot created during it is younger than this
        try:
            reply = await PlatformAdminStub(self._channel).ListSlots(
                admin.ListSlotsRequest(), wait_for_ready=wait_for_ready, timeout=30
            )
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            if self.lists:
                log.info("the platform cannot list its slots: no reconcile")
            self.lists = False
            return None
        slots = [
            PlatformSlot(id=s.id, instance_id=s.instance_id, memory_mb=s.memory_in_mb, created_ms=s.create_time)
            for s in reply.slots
        ]
        by_partition: dict[int, list[PlatformSlot]] = {p: [] for p in range(PARTITIONS)}
        for slot in slots:
            by_partition[partition(owner(slot) or SYSTEM_KEY)].append(slot)
        grace_ms = int(self.reconcile_grace_s * 1000 * self.clock.speed)
        await asyncio.gather(
            *(
                send(
                    self._nc,
                    Reconcile(key=SYSTEM_KEY, slots=tuple(mine), listed_ms=listed_ms, grace_ms=grace_ms, partition=p),
                    subject=f"{REPORT}.{p}",
                )
                for p, mine in by_partition.items()
            )
        )
        return len(slots)
