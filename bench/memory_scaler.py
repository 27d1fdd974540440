"""The live floor of a Python gRPC scaler on this machine: the demo policy, in memory, storing nothing.

    python bench/memory_scaler.py --platform HOST:PORT [--listen 127.0.0.1:0]

Written for bench/live.py, as the reference our node is measured against: the same wire protocol and
the same decisions as `--policy demo` (a request that finds no idle instance starts its own and waits
for it; a freed instance goes idle for the next arrival, the most recently freed first, and is
destroyed after 5 minutes idle), with nothing stored, nothing replicated, no leases: what is left of an
Assign's or an Idle's time is gRPC and Python.
"""

import argparse
import asyncio
import itertools
import signal
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc

KEEP_ALIVE_S = 300.0


class MemoryScaler(pb_grpc.ScalerServicer):
    def __init__(self, platform: pb_grpc.PlatformStub) -> None:
        self.platform = platform
        self.idle: dict[str, list[str]] = {}  # function -> its idle instances, the most recently freed last
        self.slots: dict[str, str] = {}  # instance -> its slot
        self.expiry: dict[str, asyncio.TimerHandle] = {}  # idle instance -> its keep-alive's end
        self.numbers = itertools.count(1)
        self.destroying: set[asyncio.Task] = set()

    async def Assign(self, request: pb.AssignRequest, context) -> pb.AssignReply:
        meta = request.meta_data
        idle = self.idle.setdefault(meta.key, [])
        if idle:
            instance = idle.pop()
            self.expiry.pop(instance).cancel()
        else:
            instance = f"{meta.key}-{next(self.numbers)}"
            config = pb.ResourceConfig(memory_in_megabytes=meta.memory_in_mb)
            created = await self.platform.CreateSlot(pb.CreateSlotRequest(request_id=instance, resource_config=config))
            if created.status != pb.Ok:
                return pb.AssignReply(status=pb.InternalError, error_message=created.error_message)
            self.slots[instance] = created.slot.id
            init = pb.InitRequest(request_id=instance, slot_id=created.slot.id, instance_id=instance, meta_data=meta)
            if (await self.platform.Init(init)).status != pb.Ok:
                return pb.AssignReply(status=pb.InternalError, error_message="Init failed")
        assignment = pb.Assignment(request_id=request.request_id, meta_key=meta.key, instance_id=instance)
        return pb.AssignReply(status=pb.Ok, assigment=assignment)

    async def Idle(self, request: pb.IdleRequest, context) -> pb.IdleReply:
        a = request.assigment
        if request.result.need_destroy:
            self._destroy_soon(a.instance_id)
        else:
            self.idle.setdefault(a.meta_key, []).append(a.instance_id)
            loop = asyncio.get_running_loop()
            self.expiry[a.instance_id] = loop.call_later(KEEP_ALIVE_S, self._expire, a.meta_key, a.instance_id)
        return pb.IdleReply(status=pb.Ok)

    def _expire(self, key: str, instance: str) -> None:
        self.idle[key].remove(instance)
        del self.expiry[instance]
        self._destroy_soon(instance)

    def _destroy_soon(self, instance: str) -> None:
        task = asyncio.create_task(self._destroy(instance))
        self.destroying.add(task)
        task.add_done_callback(self.destroying.discard)

    async def _destroy(self, instance: str) -> None:
        slot = self.slots.pop(instance)
        await self.platform.DestroySlot(pb.DestroySlotRequest(request_id=f"destroy-{instance}", id=slot))


async def serve(listen: str, platform: str) -> None:
    async with grpc.aio.insecure_channel(platform) as channel:
        server = grpc.aio.server()
        pb_grpc.add_ScalerServicer_to_server(MemoryScaler(pb_grpc.PlatformStub(channel)), server)
        port = server.add_insecure_port(listen)
        await server.start()
        print(f"memory scaler on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
        await stopped()
        await server.stop(None)


async def stopped() -> None:
    """Until SIGINT or SIGTERM, taken on the event loop: a process started in the background by a shell ignores
    SIGINT, which bench/live.py stops its scalers with (they were then killed 10 s later, their probes unwritten)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--platform", required=True)
    a = p.parse_args()
    asyncio.run(serve(a.listen, a.platform))
