"""Recovery: what a node does as partitions come and go, and when the store holds less than it folded.

A partition gained is served once loaded: its functions' timers are armed (at once for a function whose
plan was owed: one of its instances left idle with no keep-alive decided), the callers of its busy
instances told their assignment again (an answer may have been lost with a node killed between its
batch's storage and its reply), and the platform asked to reconcile it (a take-over may hold instances
the platform lost, or miss slots it made). A partition given up is snapshotted and forgotten. A loss
(EVENTS holds less than this node folded, and not by retention) is an alarm: every partition served is
reloaded from the stream, without a snapshot of the suspect state, and reconciled.
"""

import asyncio
import contextlib
import logging

from nats.aio.client import Client

from scaler.controller.core.state import FnState, Phase
from scaler.controller.leases import ranges
from scaler.controller.ledger import Ledger
from scaler.controller.partitions import Partitions
from scaler.controller.path.lane import Lane
from scaler.controller.path.replies import Replies
from scaler.controller.path.timers import Timers
from scaler.controller.path.writer import Writer
from scaler.controller.snapshotter import Snapshotter
from scaler.proto.commands import Code, PlatformSlot, Reconcile
from scaler.proto.subjects import CMD, RECONCILE_ASK, SYSTEM_KEY, UNLISTED, partition
from scaler.runtime.bus import send
from scaler.runtime.tasks import cancelled
from scaler.store import EventStore, Retention

log = logging.getLogger("scaler.controller")

ASK_TIMEOUT_S = 6.0  # a gc worker answers an ask once it knows whether the platform lists its slots
ASK_PATIENCE_S = 30.0


class Recovery:
    def __init__(
        self,
        nc: Client,
        store: EventStore,
        replicas: int,
        retention: Retention,
        ledger: Ledger,
        lane: Lane,
        replies: Replies,
        timers: Timers,
        writer: Writer,
        snapshots: Snapshotter,
    ) -> None:
        self.nc = nc
        self.store = store
        self.replicas = replicas
        self.retention = retention
        self.ledger = ledger
        self.lane = lane
        self.replies = replies
        self.timers = timers
        self.writer = writer
        self.snapshots = snapshots
        self.partitions: Partitions | None = None  # set once made (it is told of what this says)
        self.losses = 0  # times EVENTS was found to hold less than this node had folded (not by retention)
        self.unreconciled = 0  # loads of partitions the platform could not be reconciled for (it cannot list slots)
        self._asking: asyncio.Task | None = None  # the ask to reconcile under way
        self.reloading = ""  # why every partition is being reloaded, while it is

    async def stop(self) -> None:
        await cancelled(self._asking)  # no gc worker may be there to answer (a node alone)

    async def served(self, partitions: list[int]) -> None:
        """Loaded and served: arm their timers, tell their callers again what they were assigned, and have the
        platform reconciled."""
        now = self.lane.clock.now_ms()
        doubted = set(self.writer.in_doubt(set(partitions)))  # settled (a fence) by the Tick, whatever else is due
        for key in self.partitions.keys(partitions):
            owed = _plan_owed(self.ledger.state(key)) or key in doubted
            self.timers.set(key, now if owed else self.ledger.wake.get(key))
            await self.replies.send(self.lane.assignments(key))
        if self._asking is None or self._asking.done():  # one ask at a time answers for every load before it
            self._asking = asyncio.create_task(self._ask_reconcile())

    async def released(self, held: dict[int, int], partitions: list[int]) -> None:
        """Given up, their commands done: snapshot those served, each within the holding of its lease it was served in
        (`held`: partition -> tenure; at the newest watermark when stopping), forget all."""
        stopping = self.snapshots.stopping
        await asyncio.gather(*(self.snapshots.save(p, force=stopping, tenure=t) for p, t in held.items()))
        for key in self.partitions.keys(partitions):
            self.timers.set(key, None)
            self.ledger.forget(key)
        self.writer.forget(set(partitions))  # nothing decided for them here is sent any more
        self.snapshots.forget(partitions)

    async def lost(self, why: str) -> None:
        """EVENTS holds less than this node folded, and not by retention: an alarm (a log line, the losses
        metric), then every partition served is reloaded from the stream and the platform asked to reconcile."""
        if self.reloading:
            return
        self.reloading = why
        try:
            self.losses += 1
            partitions = sorted(self.partitions.serving | set(self.partitions.loading) | set(self.partitions.refused))
            log.error("EVENTS lost batches: %s; reloading partitions %s from the stream and reconciling them",
                      why, ranges(partitions))  # fmt: skip
            held = self._slots(partitions)  # what the platform runs for them, as this node knew before the loss

            async def start_over() -> None:
                with contextlib.suppress(Exception):  # a stream gone is made again (empty)
                    await self.store.ensure(self.replicas, self.retention)
                at = await self.store.kept()
                self.ledger.seq = 0
                self.snapshots.restart(at.stream_id, at.last_seq)

            await self.partitions.reload(partitions, start_over)
            await self._retire_unknown(held)
        except Exception as e:  # NATS away meanwhile: the next look finds it again
            log.warning("could not reload after the loss: %s", e)
        finally:
            self.reloading = ""

    def _slots(self, partitions: list[int]) -> dict[int, list[PlatformSlot]]:
        """The platform's slots this node's state holds for those partitions."""
        held: dict[int, list[PlatformSlot]] = {p: [] for p in partitions}
        for key in self.partitions.keys(partitions):
            for i in self.ledger.state(key).instances.values():
                if i.slot_id:
                    slot = PlatformSlot(id=i.slot_id, instance_id=i.id, memory_mb=i.memory_mb, created_ms=i.wanted_ms)
                    held[partition(key)].append(slot)
        return held

    async def _retire_unknown(self, held: dict[int, list[PlatformSlot]]) -> None:
        """The slots this node knew of before the loss, put to the reloaded partitions as the platform's list: one the
        stream no longer knows would never be destroyed on a platform that cannot list its slots (the challenge's),
        and is retired; one it knows that the node had seen destroyed is gone. Sent as any Reconcile is."""
        now = self.lane.clock.now_ms()
        sent = [
            send(
                self.nc, Reconcile(key=SYSTEM_KEY, slots=tuple(slots), listed_ms=now, partition=p), subject=f"{CMD}.{p}"
            )
            for p, slots in held.items()
        ]
        for p, outcome in zip(held, await asyncio.gather(*sent, return_exceptions=True), strict=True):
            if isinstance(outcome, Exception) or outcome.code is not Code.OK:
                log.warning("partition %d: the slots held before the loss not reconciled: %s", p, outcome)

    async def _ask_reconcile(self) -> None:
        """Ask the gc workers to reconcile, until one answers (none may be connected just now)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ASK_PATIENCE_S
        while True:
            try:
                answer = await self.nc.request(RECONCILE_ASK, b"", timeout=ASK_TIMEOUT_S)
                if answer.data == UNLISTED:  # the platform cannot list its slots: what it holds stays unchecked
                    self.unreconciled += 1
                return
            except Exception as e:
                if loop.time() > deadline:
                    log.warning("no gc worker answered the ask to reconcile (%s)", type(e).__name__)
                    return
                await asyncio.sleep(0.5)


def _plan_owed(s: FnState) -> bool:
    """Whether an instance of the function stands idle with no keep-alive decided: the plan that decides it was
    still to come when the partition changed hands (a node stopped, killed or giving it up right after the
    command), and nothing else would wake the function before its next call."""
    return any(i.phase is Phase.IDLE and not i.keep_until_ms for i in s.instances.values())
