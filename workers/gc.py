"""Destroys retired instances' slots, keeps every function's next deadline, and reconciles on start.

Deadlines: each batch carries its function's next deadline (`wake_ms`), latest wins. An ordered
consumer that starts at the last batch of every subject gives the current deadlines after a
restart, with no store of our own. When one is due, a Tick asks the controller to act; the
controller re-checks, so a reuse that raced the timer wins.

Reconcile: on start it lists the platform's live slots (PlatformAdmin.ListSlots, which the
challenge's platform lacks: then it says so once and skips) and sends them to the controller,
whose core drops instances whose slot is gone and retires slots it does not know.
"""

import asyncio
import heapq
import logging

import grpc
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from proto import platform_admin_pb2 as admin
from proto import serverless_sim_pb2 as pb
from proto.commands import AnyCommand, PlatformSlot, Reconcile, SlotDestroyed, Tick
from proto.events import Event, InstanceRetired, decode_batch
from proto.platform_admin_pb2_grpc import PlatformAdminStub
from proto.subjects import EVENTS, EVT, SYSTEM_KEY
from runtime.bus import publish_command
from runtime.clock import Clock
from workers.effects import EffectWorker, call_platform

log = logging.getLogger("scaler.gc_worker")

RECONCILE_GRACE_S = 30.0  # a slot younger than this may be one being created right now


class GcWorker(EffectWorker):
    durable = "gc-worker"
    name = "gc worker"

    def __init__(
        self,
        nats_url: str,
        platform: str,
        clock: Clock | None = None,
        concurrency: int = 1024,
        reconcile_grace_s: float = RECONCILE_GRACE_S,
    ) -> None:
        super().__init__(nats_url, platform, concurrency)
        self.clock = clock or Clock()
        self.reconcile_grace_s = reconcile_grace_s
        self.deadlines: dict[str, int] = {}  # function -> its next deadline (clock ms)
        self._heap: list[tuple[int, str]] = []
        self._changed = asyncio.Event()
        self._deadline_sub = None
        self._timer: asyncio.Task | None = None

    def wants(self, event: Event) -> bool:
        return isinstance(event, InstanceRetired) and bool(event.slot_id)

    async def act(self, key: str, event: InstanceRetired) -> AnyCommand:
        request_id = f"destroy:{event.instance_id}"
        request = pb.DestroySlotRequest(request_id=request_id, id=event.slot_id, reason=event.reason)
        reply = await call_platform(self.platform.DestroySlot, request, "DestroySlot")
        if reply.status not in (pb.Ok, pb.NotFound):  # NotFound: already gone, which is what we want
            raise RuntimeError(f"DestroySlot {event.slot_id}: {pb.Status.Name(reply.status)}: {reply.error_message}")
        return SlotDestroyed(key=key, instance_id=event.instance_id, slot_id=event.slot_id)

    async def start(self) -> str:
        what = await super().start()
        self._deadline_sub = await self._js.subscribe(
            f"{EVT}.>",
            stream=EVENTS,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            cb=self._on_deadline,
        )
        self._timer = asyncio.create_task(self._fire_due())
        slots = await self.reconcile()
        return what if slots is None else f"{what}, reconciled {slots} platform slots"

    async def reconcile(self) -> int | None:
        """Send the platform's live slots to the controller; None when the platform cannot list them."""
        listed_ms = self.clock.now_ms()  # before the call: a slot created during it is younger than this
        try:
            reply = await PlatformAdminStub(self._channel).ListSlots(admin.ListSlotsRequest(), timeout=30)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("the platform cannot list its slots: no reconcile")
            else:
                log.warning("could not list the platform's slots, no reconcile: %s %s", e.code().name, e.details())
            return None
        slots = tuple(
            PlatformSlot(id=s.id, instance_id=s.instance_id, memory_mb=s.memory_in_mb, created_ms=s.create_time)
            for s in reply.slots
        )
        grace_ms = int(self.reconcile_grace_s * 1000 * self.clock.speed)
        await publish_command(self._js, Reconcile(key=SYSTEM_KEY, slots=slots, listed_ms=listed_ms, grace_ms=grace_ms))
        return len(slots)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._deadline_sub is not None:
            await self._deadline_sub.unsubscribe()
        await super().stop()

    async def _on_deadline(self, msg: Msg) -> None:
        try:
            batch = decode_batch(msg.data)
        except Exception:
            return  # the durable consumer reports unreadable batches
        if batch.wake_ms is None:
            self.deadlines.pop(batch.key, None)
            return
        if self.deadlines.get(batch.key) != batch.wake_ms:
            self.deadlines[batch.key] = batch.wake_ms
            heapq.heappush(self._heap, (batch.wake_ms, batch.key))
            self._changed.set()

    async def _fire_due(self) -> None:
        while True:
            now = self.clock.now_ms()
            while self._heap and self._heap[0][0] <= now:
                due, key = heapq.heappop(self._heap)
                if self.deadlines.get(key) == due:  # else superseded by a later batch
                    del self.deadlines[key]
                    self.spawn(self._tick(key, due))
            self._changed.clear()
            wait = self.clock.real_s(self._heap[0][0] - now) if self._heap else None
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                pass

    async def _tick(self, key: str, due: int) -> None:
        try:
            await publish_command(self._js, Tick(key=key, due_ms=due))
        except Exception as e:
            log.error("could not send the tick for %s: %s", key, e)
