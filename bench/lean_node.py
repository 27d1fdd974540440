"""The node's core in the durable reference's shape: what the core's decisions cost live, apart from the node's path.

    python bench/lean_node.py --platform HOST:PORT --nats URL [--policy demo] [--listen 127.0.0.1:0]

Written for bench/live.py, between the durable reference (bench/durable_scaler.py) and the node. Every call is
decided by the node's own ledger and core (scaler/controller/ledger.py: the policy, the features, the totals,
the plans and their deadlines, the batches the node appends), and stored as the durable reference stores: what
queued while one append was in flight goes out as the next message, one append in flight at a time for all
functions, on a nats-server that syncs every write. An Assign is answered once its decision is stored; an Idle at
once, its release decided and stored right behind; after each group the touched functions' plans are decided and
stored before the next group. Starts and retirements call the platform inline (CreateSlot, Init, DestroySlot),
reported back to the core as the offline simulator reports them. None of the node's path: no gateway checks beyond
the request's, no partitions, leases, order checks, lanes per function, snapshots, workers or admission. So the
durable reference less this is what the core costs live, and this less the node what the node's path costs.
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

import grpc
import msgspec
import nats
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.memory_scaler import stopped
from scaler.controller.core.decide import Decision
from scaler.controller.core.policy import Policy, get_policy
from scaler.controller.ledger import Ledger
from scaler.gateway.server import assign_command, idle_command
from scaler.proto import commands as c
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.events import InstanceRetired, SlotWanted, encode_batch

STREAM = "LEAN_NODE"
SUBJECT = "lean.events"


class Log:
    """Group commit, as the durable reference's: the batches of one group as one message, one ack for all."""

    def __init__(self, nc) -> None:
        self.nc = nc

    async def append(self, batches: list[bytes]) -> int:
        ack = await self.nc.request(SUBJECT, msgspec.msgpack.encode(batches), timeout=10)
        reply = msgspec.json.decode(ack.data)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["seq"]


class LeanNode(pb_grpc.ScalerServicer):
    def __init__(self, platform: pb_grpc.PlatformStub, log: Log, policy: Policy) -> None:
        self.platform = platform
        self.log = log
        self.policy = policy
        self.ledger = Ledger()
        self.queued: list[c.AnyCommand] = []
        self.writing = False
        self.waiting: dict[str, asyncio.Future[c.Reply]] = {}  # by reply subject: an Assign's caller
        self.timers: dict[str, tuple[int, asyncio.TimerHandle]] = {}  # by function: its next Tick
        self.tasks: set[asyncio.Task] = set()
        self.calls = 0

    @staticmethod
    def now() -> int:
        return int(time.time() * 1000)

    async def Assign(self, request: pb.AssignRequest, context) -> pb.AssignReply:
        self.calls += 1
        to = f"a{self.calls}"
        answer = self.waiting[to] = asyncio.get_running_loop().create_future()
        self.submit(msgspec.structs.replace(assign_command(request), reply_to=to))
        reply = await answer
        if reply.code is not c.Code.OK:
            return pb.AssignReply(status=pb.InternalError, error_message=reply.message)
        meta = request.meta_data
        a = pb.Assignment(request_id=request.request_id, meta_key=meta.key, instance_id=reply.instance_id)
        return pb.AssignReply(status=pb.Ok, assigment=a)

    async def Idle(self, request: pb.IdleRequest, context) -> pb.IdleReply:
        self.submit(idle_command(request))  # decided and stored right behind the answer
        return pb.IdleReply(status=pb.Ok)

    def submit(self, cmd: c.AnyCommand) -> None:
        self.queued.append(cmd)
        if not self.writing:
            self.writing = True
            self.spawn(self._write())

    async def _write(self) -> None:
        """One group at a time for all functions, each group's plans stored before the next group is decided."""
        try:
            while self.queued:
                group, self.queued = self.queued, []
                touched = await self._group(group)
                await asyncio.sleep(0)  # the group's callers run on before the plans are decided
                await self._plan(touched)
        except Exception as e:  # the store failed: said, and every caller waiting told (bench/live.py counts them)
            print(f"lean node: the store failed: {e!r}", file=sys.stderr, flush=True)
            for answer in self.waiting.values():
                if not answer.done():
                    answer.set_exception(e)
            self.waiting.clear()
        finally:
            self.writing = False

    async def _group(self, group: list[c.AnyCommand]) -> list[str]:
        """Decide the group's commands in order (a function's on the state its previous one left), store their
        batches as one message, then commit, answer and act on them; the functions they touched."""
        now, last, decided, batches = self.now(), {}, [], []
        for cmd in group:
            d = last[cmd.key] = self.ledger.decide(cmd, now, self.policy, last.get(cmd.key))
            batch = self.ledger.batch(cmd, d, now)
            decided.append((cmd, d, batch is not None))
            if batch is not None:
                batches.append(encode_batch(batch))
        seq = await self.log.append(batches) if batches else None
        for cmd, d, stored in decided:
            self.ledger.commit(cmd, d, seq if stored else None)
        for _, d, _ in decided:
            self._acted(d)
            for cue in self.ledger.cues(d):  # those that follow a function come back, as the node cues them
                self.submit(cue)
        return list(last)

    async def _plan(self, keys: list[str]) -> None:
        now, planned, batches = self.now(), [], []
        for key in keys:
            d = self.ledger.plan(key, now, self.policy)
            batch = self.ledger.batch(None, d, now)
            planned.append((key, d, batch is not None))
            if batch is not None:
                batches.append(encode_batch(batch))
        seq = await self.log.append(batches) if batches else None
        for key, d, stored in planned:
            self.ledger.commit_plan(key, d, seq if stored else None)
            self._acted(d)
            self._wake(key)

    def _acted(self, d: Decision) -> None:
        """A stored decision's replies and effects."""
        for reply in d.replies:
            if (answer := self.waiting.pop(reply.to, None)) is not None:
                answer.set_result(reply)
        key = d.state.key
        for e in d.events:
            if isinstance(e, SlotWanted):
                self.spawn(self._start(key, e))
            elif isinstance(e, InstanceRetired) and e.slot_id:
                self.spawn(self._destroy(key, e.instance_id, e.slot_id))

    def _wake(self, key: str) -> None:
        due = self.ledger.wake.get(key)
        if due is None or (key in self.timers and self.timers[key][0] == due):
            return
        if key in self.timers:
            self.timers.pop(key)[1].cancel()
        handle = asyncio.get_running_loop().call_later(max(0, due - self.now()) / 1000, self._tick, key, due)
        self.timers[key] = due, handle

    def _tick(self, key: str, due: int) -> None:
        """A deadline come: decided as a Tick, and any deadline after it set again (the same one too: a timer that
        fired early finds nothing due, and the core asks for it once more)."""
        del self.timers[key]
        self.submit(c.Tick(key=key, due_ms=due))

    async def _start(self, key: str, e: SlotWanted) -> None:
        i = e.instance_id
        config = pb.ResourceConfig(memory_in_megabytes=e.meta.memory_mb)
        created = await self.platform.CreateSlot(pb.CreateSlotRequest(request_id=i, resource_config=config))
        if created.status != pb.Ok:
            self.submit(c.SlotFailed(key=key, instance_id=i, reason=created.error_message))
            return
        slot = created.slot.id
        meta = pb.Meta(key=key, runtime=e.meta.runtime, timeout_in_secs=e.meta.timeout_s, memory_in_mb=e.meta.memory_mb)
        init = await self.platform.Init(pb.InitRequest(request_id=i, slot_id=slot, instance_id=i, meta_data=meta))
        if init.status != pb.Ok:
            self.submit(c.SlotFailed(key=key, instance_id=i, reason=init.error_message, slot_id=slot))
            return
        create_ms, init_ms = created.slot.create_duration_in_ms, init.init_duration_in_ms
        self.submit(c.SlotReady(key=key, instance_id=i, slot_id=slot, create_ms=create_ms, init_ms=init_ms))

    async def _destroy(self, key: str, instance: str, slot: str) -> None:
        await self.platform.DestroySlot(pb.DestroySlotRequest(request_id=f"destroy-{instance}", id=slot))
        self.submit(c.SlotDestroyed(key=key, instance_id=instance, slot_id=slot))

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def serve(listen: str, platform: str, nats_url: str, policy: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, num_replicas=1))
    async with grpc.aio.insecure_channel(platform) as channel:
        server = grpc.aio.server()
        lean = LeanNode(pb_grpc.PlatformStub(channel), Log(nc), get_policy(policy))
        pb_grpc.add_ScalerServicer_to_server(lean, server)
        port = server.add_insecure_port(listen)
        await server.start()
        print(f"lean node on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
        await stopped()
        await server.stop(None)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--platform", required=True)
    p.add_argument("--nats", required=True)
    p.add_argument("--policy", default="demo")
    a = p.parse_args()
    asyncio.run(serve(a.listen, a.platform, a.nats, a.policy))
