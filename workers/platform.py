"""Starts instances: on each SlotWanted, CreateSlot then Init, and report SlotReady or SlotFailed."""

from proto import serverless_sim_pb2 as pb
from proto.commands import AnyCommand, SlotFailed, SlotReady
from proto.events import Event, SlotWanted, creates
from workers.effects import EffectWorker, PlatformError, call_platform


class PlatformWorker(EffectWorker):
    durable = "platform-worker"
    name = "platform worker"
    effect = "c"

    def wants(self, event: Event) -> bool:
        return creates(event)

    async def act(self, key: str, event: SlotWanted) -> AnyCommand:
        """The instance id is the request id of both calls: a redelivered event asks for the same slot."""
        i = event.instance_id
        config = pb.ResourceConfig(memory_in_megabytes=event.meta.memory_mb)
        try:
            created = await call_platform(
                self.platform.CreateSlot,
                pb.CreateSlotRequest(request_id=i, resource_config=config),
                "CreateSlot",
                self.patience_s,
            )
        except PlatformError as e:
            return SlotFailed(key=key, instance_id=i, reason=str(e))
        if created.status != pb.Ok or not created.HasField("slot"):
            return SlotFailed(key=key, instance_id=i, reason=f"CreateSlot: {_status(created)}")
        slot = created.slot
        meta = pb.Meta(
            key=key,
            runtime=event.meta.runtime,
            timeout_in_secs=event.meta.timeout_s,
            memory_in_mb=event.meta.memory_mb,
        )
        request = pb.InitRequest(request_id=i, slot_id=slot.id, instance_id=i, meta_data=meta)
        try:
            init = await call_platform(self.platform.Init, request, "Init", self.patience_s)
        except PlatformError as e:
            return SlotFailed(key=key, instance_id=i, reason=str(e), slot_id=slot.id)
        if init.status != pb.Ok:
            return SlotFailed(key=key, instance_id=i, reason=f"Init: {_status(init)}", slot_id=slot.id)
        return SlotReady(
            key=key,
            instance_id=i,
            slot_id=slot.id,
            create_ms=slot.create_duration_in_ms,
            init_ms=init.init_duration_in_ms,
        )


def _status(reply) -> str:
    name = pb.Status.Name(reply.status)
    return f"{name}: {reply.error_message}" if reply.error_message else name
