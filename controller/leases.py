"""Which partitions this node writes: leases in JetStream KV, shared fairly among the live nodes.

Every node heartbeats in one bucket and holds its partitions in another, both with entries that
expire unless renewed (`ttl_s`). Each round (every `every_s`) a node renews what it holds, counts
the live nodes, gives back what is above its fair share (ceil(partitions / nodes)) and takes free
partitions up to it. A node that dies stops renewing: its leases expire and the others take its
partitions within a few seconds. A lease only says who should write: what keeps two writers from
corrupting a function is the expected-sequence check of every append (runtime/stream.py), so
a node that lost its lease without noticing yet can only fail to append, never overwrite.
"""

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from proto.subjects import PARTITIONS
from runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.leases")

LEASES = "scaler_leases"  # p<N> -> the node that writes partition N
NODES = "scaler_nodes"  # <node> -> heartbeat
TTL_S = 4.0
EVERY_S = 1.0


async def bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int) -> KeyValue:
    """The bucket, created if missing (an existing one keeps its replicas: an operator may have raised them)."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        config = KeyValueConfig(bucket=name, ttl=ttl_s, history=1, storage=StorageType.FILE, replicas=replicas)
        return await js.create_key_value(config)


class Leases:
    def __init__(
        self,
        js: JetStreamContext,
        node: str,
        gained: Callable[[list[int]], Awaitable[None]],
        lost: Callable[[list[int]], Awaitable[None]],
        ttl_s: float = TTL_S,
        every_s: float = EVERY_S,
        replicas: int = 1,
    ) -> None:
        self.js = js
        self.node = node
        self.gained = gained  # called with partitions just leased: load them, then serve
        self.lost = lost  # called with partitions to stop serving, before their leases are given back
        self.ttl_s = ttl_s
        self.every_s = every_s
        self.replicas = replicas
        self.held: dict[int, int] = {}  # partition -> revision of our lease entry
        self._leases: KeyValue | None = None
        self._nodes: KeyValue | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._leases = await bucket(self.js, LEASES, self.ttl_s, self.replicas)
        self._nodes = await bucket(self.js, NODES, self.ttl_s, self.replicas)
        await self.round()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Give everything back at once, so the other nodes need not wait for the leases to expire."""
        await cancelled(self._task)
        if self._nodes is None:  # its start failed before it held anything
            return
        # Each on its own (NATS away: they lapse instead): a heartbeat left behind would make the next
        # node count two and take half the partitions until it lapsed.
        await asyncio.gather(self.give_back(sorted(self.held)), self._nodes.delete(self.node), return_exceptions=True)

    async def _run(self) -> None:
        failing = 0
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.round()
            except Exception as e:  # NATS away: the leases may lapse; the round after the outage sorts it out
                failing += 1
                if failing == 1:  # a lasting fault is one line, and one when it ends
                    log.warning("lease rounds fail (%s); retrying every %gs", e, self.every_s)
                continue
            if failing:
                log.info("lease rounds work again after %d failed", failing)
                failing = 0

    async def live_nodes(self) -> int:
        try:
            return max(1, len(await self._nodes.keys()))
        except NoKeysError:
            return 1

    async def round(self) -> None:
        await self._nodes.put(self.node, b"")
        await self._renew()
        share = math.ceil(PARTITIONS / await self.live_nodes())
        if len(self.held) > share:
            await self.give_back(sorted(self.held)[share:])
        elif len(self.held) < share:
            await self._take(share - len(self.held))

    async def _renew(self) -> None:
        lost = []
        for p, revision in list(self.held.items()):
            try:
                self.held[p] = await self._leases.update(f"p{p}", self.node.encode(), last=revision)
            except KeyWrongLastSequenceError:  # it lapsed (NATS was away a while): take it back if nobody did
                try:
                    self.held[p] = await self._leases.create(f"p{p}", self.node.encode())
                except KeyWrongLastSequenceError:  # someone else holds it now
                    lost.append(p)
        if lost:
            log.warning("leases lapsed on partitions %s: another node writes them now", lost)
            for p in lost:
                del self.held[p]
            await self.lost(lost)

    async def _take(self, wanted: int) -> None:
        taken = []
        for p in range(PARTITIONS):
            if len(taken) == wanted:
                break
            if p in self.held:
                continue
            try:
                self.held[p] = await self._leases.create(f"p{p}", self.node.encode())
                taken.append(p)
            except KeyWrongLastSequenceError:
                continue  # someone holds it
        if taken:
            log.info("%s leased partitions %s", self.node, _ranges(taken))
            await self.gained(taken)

    async def give_back(self, partitions: list[int]) -> None:
        """Stop serving them, then free their leases for another node."""
        partitions = [p for p in partitions if p in self.held]
        if not partitions:
            return
        await self.lost(partitions)
        freed = [(p, self.held.pop(p)) for p in partitions]
        # All at once and each on its own: one that times out (NATS slow or away) lapses after the TTL,
        # and does not keep the others held until then, nor the stop waiting a timeout per partition.
        results = await asyncio.gather(
            *(self._leases.delete(f"p{p}", last=revision) for p, revision in freed), return_exceptions=True
        )
        stuck = [
            p
            for (p, _), r in zip(freed, results, strict=True)
            if isinstance(r, Exception) and not isinstance(r, (KeyWrongLastSequenceError, KeyNotFoundError))
        ]
        if stuck:
            log.warning("could not free the leases of partitions %s; they lapse within %gs", _ranges(stuck), self.ttl_s)
        log.info("%s gave back partitions %s", self.node, _ranges(partitions))


async def holders(js: JetStreamContext) -> dict[int, str]:
    """Who holds each leased partition now (a lease given back meanwhile is left out)."""
    try:
        kv = await js.key_value(LEASES)
        keys = await kv.keys()
    except (BucketNotFoundError, NoKeysError):
        return {}
    held = {}
    for key in keys:
        with contextlib.suppress(KeyNotFoundError):  # deleted since it was listed
            held[int(key[1:])] = (await kv.get(key)).value.decode()
    return held


def _ranges(partitions: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], None
    for a, b in zip(partitions, [*partitions[1:], None], strict=True):
        start = a if start is None else start
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else f"{a}")
            start = None
    return ", ".join(out)
