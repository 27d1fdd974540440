"""Starts instances: on each SlotWanted, CreateSlot, report the slot, Init, and report SlotReady or SlotFailed.

A platform may create a new slot on every CreateSlot and refuse a second Init on a slot, counting it
as an error (the challenge's did), so a start is never simply done again:
- the slot is reported (SlotCreated) as Init goes out, and SlotReady only once that report is stored,
  so the state knows every slot an instance is ready on, and a cold start waits for the longer of
  Init and the report rather than for both in turn (in a burst the report waits its turn in a busy
  node: about 100 ms a start, measured); a slot made for an instance no longer wanted has its Init
  dropped and is destroyed. A worker that dies during Init has its slot recorded once the report was
  stored (milliseconds: well within an Init);
- the same event delivered again while this process still performs it joins that work, and after
  a failure here (NATS away too long) continues from the slot this process made or the Init it
  finished, whose report it sends again;
- delivered again after another worker died with it, the function's events after the SlotWanted
  say how far it got: the instance is ready or gone (nothing to do), or has a slot, or none yet.
  What the dead worker did on the platform is then found where the platform lists its slots
  (PlatformAdmin.ListSlots: each slot's CreateSlot request id, the instance Init was asked for and
  whether it finished): a slot made for this start is taken rather than made again, and an Init that
  arrived is waited for and reported rather than sent again. A platform that cannot list them
  cannot say whether an Init arrived, so a recorded slot is never initialised a second time: the
  instance is started on a new slot and the first is destroyed (one more slot and Init, never an
  Init the platform refuses). Without a slot recorded, CreateSlot is called again with the same
  request id: a platform that dedupes answers the first slot, one that tears down a CreateSlot
  whose caller went away made none.
One window is left on a platform that neither lists nor dedupes: a worker killed between CreateSlot's
answer and SlotCreated being stored (milliseconds) leaves a slot nothing can name.
"""

import asyncio
import logging
from typing import NamedTuple

import grpc
import msgspec

from scaler.proto import platform_admin_pb2 as admin
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.commands import AnyCommand, Code, SlotCreated, SlotFailed, SlotReady
from scaler.proto.events import (
    Batch,
    Event,
    InstanceCreated,
    InstanceDestroyed,
    InstanceReady,
    InstanceRetired,
    SlotWanted,
    creates,
)
from scaler.proto.platform_admin_pb2_grpc import PlatformAdminStub
from scaler.proto.subjects import function_events
from scaler.store import stream
from scaler.workers.circuit import HOLD_POLL_S, Circuits
from scaler.workers.effects import (
    CALL_TIMEOUT_S,
    REPORT_PATIENCE_S,
    Delivery,
    EffectWorker,
    PlatformError,
    brief,
    call_platform,
    report,
)

log = logging.getLogger("scaler.platform_worker")
FIND_POLL_S = 0.2  # how often a dead worker's Init, found under way on the platform, is looked at until it finishes


class SlotMade(NamedTuple):
    id: str
    create_ms: int


class PlatformWorker(EffectWorker):
    durable = "platform-worker"
    name = "platform worker"
    effect = "c"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.circuits = Circuits()  # toward a platform failing start after start
        self._starts: dict[str, asyncio.Future[AnyCommand | None]] = {}  # by instance: under way or done here
        self._made: dict[str, SlotMade] = {}  # by instance: the slot this process created, not yet reported
        # By instance: the slot this process sent Init to, and that Init's outcome.
        self._inits: dict[str, tuple[str, asyncio.Future[SlotReady | SlotFailed]]] = {}

    def wants(self, event: Event) -> bool:
        return creates(event)

    async def act(self, key: str, event: SlotWanted, delivery: Delivery) -> AnyCommand | None:
        i = event.instance_id
        start = self._starts.get(i)
        if start is None or (start.done() and (start.cancelled() or start.exception() is not None)):
            start = self._starts[i] = asyncio.ensure_future(self._start(key, event, delivery))
        return await asyncio.shield(start)

    def forget(self, events: list[Event]) -> None:
        for e in events:
            self._starts.pop(e.instance_id, None)
            self._made.pop(e.instance_id, None)
            self._inits.pop(e.instance_id, None)

    async def _start(self, key: str, event: SlotWanted, delivery: Delivery) -> AnyCommand | None:
        with self.circuits.starting(key):
            return await self._resume_or_start(key, event, delivery)

    async def _resume_or_start(self, key: str, event: SlotWanted, delivery: Delivery) -> AnyCommand | None:
        i = event.instance_id
        if (made := self._made.get(i)) is not None:  # made here, its report not stored: its Init is joined
            return await self._report_and_init(key, event, made)
        if delivery.redelivered:
            done, recorded = await self._recorded(key, i, delivery.seq)
            if done:
                return None
            return await self._resume(key, event, recorded)
        return await self._create_and_init(key, event, _call_id(event))

    async def _resume(self, key: str, event: SlotWanted, recorded: SlotMade | None) -> AnyCommand | None:
        """Another worker's start, which may have made a slot (recorded or not) and sent Init: what it did is found
        on a platform that lists its slots, and never done a second time on one that cannot say."""
        i = event.instance_id
        listing = await self._listing()
        if recorded is None:
            return await self._create_and_init(key, event, _call_id(event), listing)
        if listing is None:
            log.info("%s: the Init of slot %s may have run and the platform cannot say: starting it on a new slot",
                     i, recorded.id)  # fmt: skip
            return await self._create_and_init(key, event, _replacing(event, recorded))
        info = listing.get(recorded.id)
        if info is None or info.instance_id not in ("", i):  # the slot gone (or another's): start it anew
            return await self._create_and_init(key, event, _replacing(event, recorded), listing)
        return await self._init_or_find(key, event, recorded, info)

    async def _listing(self) -> dict[str, admin.SlotInfo] | None:
        """The platform's live slots by id; None when it cannot list them (the challenge's: UNIMPLEMENTED)."""
        try:
            reply = await PlatformAdminStub(self._channel).ListSlots(admin.ListSlotsRequest(), timeout=30)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise PlatformError(f"ListSlots: {e.code().name}: {brief(e.details() or '')}") from None
        return {s.id: s for s in reply.slots}

    async def _init_or_find(
        self, key: str, event: SlotWanted, slot: SlotMade, info: admin.SlotInfo | None
    ) -> SlotReady | SlotFailed:
        """Init on `slot`, unless the platform's listing (`info`) says an Init for this instance arrived there: then
        its outcome, waited for, never a second Init."""
        if info is None or not info.instance_id:
            return await self._init(key, event, slot)
        i = event.instance_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_TIMEOUT_S
        while not info.ready:
            if loop.time() >= deadline:
                why = f"the Init of {i} on slot {slot.id} that a dead worker sent did not finish in {CALL_TIMEOUT_S:g}s"
                return SlotFailed(key=key, instance_id=i, reason=why, slot_id=slot.id)
            await asyncio.sleep(FIND_POLL_S)
            info = (await self._listing() or {}).get(slot.id)
            if info is None or info.instance_id != i:
                return SlotFailed(
                    key=key, instance_id=i, reason=f"slot {slot.id} went away during Init", slot_id=slot.id
                )
        log.info(
            "%s: Init on slot %s was done by a worker that died before it reported: found, not repeated", i, slot.id
        )
        return SlotReady(key=key, instance_id=i, slot_id=slot.id, create_ms=slot.create_ms)

    async def _recorded(self, key: str, instance_id: str, seq: int) -> tuple[bool, SlotMade | None]:
        """What the function's events after the SlotWanted (at `seq`) say of the instance: whether its start
        is over (ready or gone), and the slot recorded for it."""
        over, slot = False, None

        def look(_: int, batch: Batch) -> bool:
            nonlocal over, slot
            for e in batch.events:
                if getattr(e, "instance_id", None) != instance_id:
                    continue
                if isinstance(e, InstanceCreated):
                    slot = SlotMade(e.slot_id, e.create_ms)
                elif isinstance(e, InstanceReady | InstanceRetired | InstanceDestroyed):
                    over = True
            return over

        await stream.read(self._js, look, function_events(key), after_seq=seq)
        return over, slot

    async def _create_and_init(
        self, key: str, event: SlotWanted, request_id: str, listing: dict[str, admin.SlotInfo] | None = None
    ) -> AnyCommand | None:
        """CreateSlot for `request_id`, then report it and Init it; a slot the platform lists as made for that request
        id (a dead worker's, never recorded) is taken instead of made again."""
        i = event.instance_id
        found = next((s for s in (listing or {}).values() if s.request_id == request_id), None)
        if found is not None and found.instance_id in ("", i):
            log.info("%s: slot %s, made for %s by a worker that died before it recorded it: found, not made again",
                     i, found.id, request_id)  # fmt: skip
            made = self._made[i] = SlotMade(found.id, 0)
            return await self._report_and_init(key, event, made, found)
        if (refused := await self._let_through(key, i)) is not None:
            return refused
        config = pb.ResourceConfig(memory_in_megabytes=event.meta.memory_mb)
        request = pb.CreateSlotRequest(request_id=request_id, resource_config=config)
        circuit = self.circuits.create
        try:
            create = self.platform.CreateSlot
            created = await call_platform(create, request, "CreateSlot", self.patience_s, self.platform_addr)
        except PlatformError as e:
            circuit.failed(str(e))
            self.circuits.init(key).abandoned()
            return SlotFailed(key=key, instance_id=i, reason=str(e), retry_after_ms=circuit.next_try_ms())
        except BaseException:
            circuit.abandoned()
            self.circuits.init(key).abandoned()
            raise
        if created.status != pb.Ok or not created.HasField("slot"):
            circuit.failed(f"CreateSlot: {_status(created)}")
            self.circuits.init(key).abandoned()
            why = f"CreateSlot: {_status(created)}"
            return SlotFailed(key=key, instance_id=i, reason=why, retry_after_ms=circuit.next_try_ms())
        circuit.succeeded()
        made = self._made[i] = SlotMade(created.slot.id, created.slot.create_duration_in_ms)
        return await self._report_and_init(key, event, made)

    async def _let_through(self, key: str, instance_id: str) -> SlotFailed | None:
        """None once CreateSlot's and the function's Init circuits let this start through (closed, or it is their
        probe); while one is open the start waits, up to the circuits' `hold_s`, then is refused without a platform
        call. Waiting, its request stays queued: an instance of the function that frees up meanwhile serves it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.circuits.hold_s
        while True:
            create, init = self.circuits.create, self.circuits.init(key)
            wait, circuit = create.refuses(), create
            if not wait:
                wait, circuit = init.refuses(), init
                if wait:
                    create.abandoned()  # it may have let this start through as its probe
            if not wait:
                return None
            if loop.time() >= deadline:
                circuit.refused += 1
                why = f"{circuit.what} failed {circuit.failures} times in a row (the latest: {circuit.last}): not tried"
                after_ms = max(1, round(wait * 1000))
                return SlotFailed(key=key, instance_id=instance_id, reason=why, retry_after_ms=after_ms)
            await asyncio.sleep(min(wait, HOLD_POLL_S, max(deadline - loop.time(), 0.0)))

    async def _report_and_init(
        self, key: str, event: SlotWanted, slot: SlotMade, info: admin.SlotInfo | None = None
    ) -> AnyCommand | None:
        """Report the slot and Init it (or wait for the Init the platform's listing `info` says arrived there) at
        once; the outcome once the slot is stored, and only if it is still wanted: an Init for an instance given up
        is dropped (the controller destroys its slot). A report sent again (NATS away) joins the Init sent first,
        never a second one on the slot."""
        i = event.instance_id
        circuit = self.circuits.init(key)
        sent, init = self._inits.get(i, ("", None))
        if init is None or sent != slot.id:
            init = asyncio.ensure_future(self._init_or_find(key, event, slot, info))
            self._inits[i] = slot.id, init
        try:
            created = SlotCreated(key=key, instance_id=i, slot_id=slot.id, create_ms=slot.create_ms)
            answer = await report(self._nc, created, patience_s=REPORT_PATIENCE_S)
            self._made.pop(i, None)
            if answer.code is not Code.OK:
                log.info("%s: dropping the Init on %s: %s", i, slot.id, answer.message)  # the controller destroys it
                init.cancel()
                circuit.abandoned()
                return None
            done = await asyncio.shield(init)
        except BaseException:
            circuit.abandoned()
            raise
        if isinstance(done, SlotReady):
            circuit.succeeded()
        else:
            circuit.failed(done.reason)
            done = msgspec.structs.replace(done, retry_after_ms=circuit.next_try_ms())  # this failure may open it
        return done

    async def _init(self, key: str, event: SlotWanted, slot: SlotMade) -> SlotReady | SlotFailed:
        """The instance id is Init's request id: a kind platform joins a repeated Init to the one under way."""
        i = event.instance_id
        meta = pb.Meta(
            key=key,
            runtime=event.meta.runtime,
            timeout_in_secs=event.meta.timeout_s,
            memory_in_mb=event.meta.memory_mb,
        )
        call = f"{_call_id(event)}/{slot.id}"
        request = pb.InitRequest(request_id=call, slot_id=slot.id, instance_id=i, meta_data=meta)
        try:
            init = await call_platform(self.platform.Init, request, "Init", self.patience_s, self.platform_addr)
        except PlatformError as e:
            return SlotFailed(key=key, instance_id=i, reason=str(e), slot_id=slot.id)
        if init.status != pb.Ok:
            return SlotFailed(key=key, instance_id=i, reason=f"Init: {_status(init)}", slot_id=slot.id)
        return SlotReady(
            key=key, instance_id=i, slot_id=slot.id, create_ms=slot.create_ms, init_ms=init.init_duration_in_ms
        )


def _status(reply) -> str:
    name = pb.Status.Name(reply.status)
    return f"{name}: {brief(reply.error_message)}" if reply.error_message else name


def _call_id(event: SlotWanted) -> str:
    """The request id of this start's platform calls: the same for the same event delivered again (a platform
    that dedupes by it answers the first call's result), another for an instance id used again after events
    were lost (the state that numbers instances was reloaded from a stream missing its tail)."""
    return f"{event.instance_id}@{event.at_ms}"


def _replacing(event: SlotWanted, slot: SlotMade) -> str:
    """The request id of the CreateSlot that replaces `slot`: one per slot replaced, so that a replacement cut short
    and replaced in turn is another request, and the same one asked again is the same."""
    return f"{_call_id(event)}/replacing/{slot.id}"
