"""A lean durable scaler: the demo policy, every decision stored first, as the node's storage contract asks.

    python bench/durable_scaler.py --platform HOST:PORT --nats URL [--listen 127.0.0.1:0]

Written for bench/live.py, beside the in-memory reference (bench/memory_scaler.py): the same wire
protocol and decisions as `--policy demo`, and the node's contract for what it hands out. Every decision
is one event on a JetStream stream with file storage, on a nats-server that syncs every write (the bench
starts it so); the events queued while one append is in flight go out together as the next message
(group commit), one append in flight at a time for all functions. An Assign is answered once its event
is stored; an Idle at once, its instance back among the idle ones only once its release is stored. One
event a call. Unlike the node it checks no order per function (one process, one writer: nothing to
fence), keeps no snapshot and decides nothing beside the calls but keep-alive ends. So the node less
this is the cost of the node's own machinery, and this less the in-memory reference the cost of storing.
"""

import argparse
import asyncio
import json
import sys
from pathlib import Path

import grpc
import nats
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.memory_scaler import MemoryScaler, stopped
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc

STREAM = "DURABLE_REFERENCE"
SUBJECT = "reference.events"


class Log:
    """Group commit: what is queued while an append is in flight goes out as the next message, one ack for all."""

    def __init__(self, nc) -> None:
        self.nc = nc
        self.queued: list[tuple[dict, asyncio.Future]] = []
        self.writing = False

    async def store(self, event: dict) -> None:
        stored = asyncio.get_running_loop().create_future()
        self.queued.append((event, stored))
        if not self.writing:
            self.writing = True
            asyncio.get_running_loop().create_task(self._write())
        await stored

    async def _write(self) -> None:
        try:
            while self.queued:
                group, self.queued = self.queued, []
                ack = await self.nc.request(SUBJECT, json.dumps([e for e, _ in group]).encode(), timeout=10)
                if b'"error"' in ack.data:
                    raise RuntimeError(ack.data.decode())
                for _, stored in group:
                    stored.set_result(None)
        except Exception as e:
            for _, stored in self.queued:
                stored.set_exception(e)
            raise
        finally:
            self.writing = False


class DurableScaler(MemoryScaler):
    """MemoryScaler's decisions, each stored before what depends on it is handed out."""

    def __init__(self, platform: pb_grpc.PlatformStub, log: Log) -> None:
        super().__init__(platform)
        self.log = log

    async def Assign(self, request: pb.AssignRequest, context) -> pb.AssignReply:
        reply = await super().Assign(request, context)  # an idle instance taken, or one started for it
        if reply.status == pb.Ok:
            a = reply.assigment
            await self.log.store({"assigned": a.request_id, "key": a.meta_key, "instance": a.instance_id})
        return reply

    async def Idle(self, request: pb.IdleRequest, context) -> pb.IdleReply:
        a = request.assigment
        release = {"released": a.request_id, "key": a.meta_key, "instance": a.instance_id}
        task = asyncio.get_running_loop().create_task(self._released(request, context, release))
        self.destroying.add(task)
        task.add_done_callback(self.destroying.discard)
        return pb.IdleReply(status=pb.Ok)

    async def _released(self, request: pb.IdleRequest, context, release: dict) -> None:
        await self.log.store(release)
        await super().Idle(request, context)  # idle again (or destroyed) only once the release is stored

    async def _destroy(self, instance: str) -> None:
        await self.log.store({"destroyed": instance})
        await super()._destroy(instance)


async def serve(listen: str, platform: str, nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, num_replicas=1))
    async with grpc.aio.insecure_channel(platform) as channel:
        server = grpc.aio.server()
        scaler = DurableScaler(pb_grpc.PlatformStub(channel), Log(nc))
        pb_grpc.add_ScalerServicer_to_server(scaler, server)
        port = server.add_insecure_port(listen)
        await server.start()
        print(f"durable scaler on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
        await stopped()
        await server.stop(None)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--platform", required=True)
    p.add_argument("--nats", required=True)
    a = p.parse_args()
    asyncio.run(serve(a.listen, a.platform, a.nats))
