"""The run's totals across nodes: each node says what its partitions add up to, and hears the others.

The learned policy values waiting at an exchange rate taken from the whole run's totals (execution,
waiting, the idle a clairvoyant scaler would pay). A node holds only some partitions, so each one
puts its totals in a KV bucket every second and adds up the others'. Measured offline
(`bench/nodes.py`): with the totals split over four nodes the learned policy lost 5 points on a
mixed trace; shared, it decides as one node does. An entry expires with its node (the lease TTL),
and a partition's totals move with it, so a dead node's are not counted twice for longer than that.

What a tenant's functions hold (Totals.tenants, what its quotas count) cannot wait a second: two nodes
would start past a quota meanwhile. So a node also tells the others its tenants' counts the moment they
change, and again at each exchange (core NATS, `scaler.tenants.held`: in order from each node, so its
last word is its newest; one missed is repaired by the next), and the others count them at once. Two
nodes starting for one tenant within the same few milliseconds may still pass its quota by one instance
each; a node dead or drained holds its count until its entry expires, so a quota is held too tightly for
that while, never too loosely.
"""

import asyncio
import contextlib
import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from scaler.controller.core.state import Held
from scaler.controller.core.totals import Totals
from scaler.controller.leases import bucket
from scaler.controller.ledger import Ledger
from scaler.runtime.kv import entries
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.shared")

BUCKET = "scaler_totals"
HELD = "scaler.tenants.held"  # a node's tenants' counts, told as they change
TELL_EVERY_S = 0.02  # at most one word of a node's tenants' counts this often: a burst of changes is told once
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Totals)


class TenantsHeld(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    tenants: dict[str, Held]


_held_decoder = msgspec.msgpack.Decoder(TenantsHeld)


class SharedTotals:
    def __init__(self, nc: Client, node: str, ledger: Ledger, ttl_s: float, every_s: float, replicas: int):
        self.nc = nc
        self.js = nc.jetstream()
        self.node = node
        self.ledger = ledger  # the node's ledger: its totals go out, the others' come in
        self.ttl_s = ttl_s
        self.every_s = every_s
        self.replicas = replicas
        self._kv = None
        self._task: asyncio.Task | None = None
        self._sub = None
        self._theirs: dict[str, Totals] = {}  # by node: the totals it last put in the bucket
        self._told_held: dict[str, dict[str, Held]] = {}  # by node: its tenants' counts as it last told them
        self._moved = asyncio.Event()  # set by the ledger when this node's tenants' counts change
        self._said: dict[str, Held] | None = None  # the counts this node last told

    async def start(self) -> None:
        self._kv = await bucket(self.js, BUCKET, self.ttl_s, self.replicas)
        self._sub = await self.nc.subscribe(HELD, cb=self._told)
        self.ledger.tenants_moved = self._moved.set
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.ledger.tenants_moved = lambda: None
        await cancelled(self._task)
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self._kv.delete(self.node)

    async def _run(self) -> None:
        """An exchange every `every_s`, and between two a word whenever the tenants' counts change: woken by the
        ledger, not by a timer, so a node whose tenants hold still spends nothing on it."""
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(Exception):  # NATS away: the totals are a little older, that is all
                await self.exchange()
            until = loop.time() + self.every_s
            while (left := until - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._moved.wait()
                self._moved.clear()
                if self.ledger.totals.tenants is not self._said:  # moved since the last word, the exchange's too
                    with contextlib.suppress(Exception):  # the next exchange tells it all the same
                        await self._tell(self.ledger.totals.tenants)
                    await asyncio.sleep(TELL_EVERY_S)

    async def exchange(self) -> None:
        totals = self.ledger.totals
        await self._kv.put(self.node, _encoder.encode(totals))
        await self._tell(totals.tenants)
        theirs = {}
        for key, value in (await entries(self.js, BUCKET)).items():
            if key == self.node:
                continue
            with contextlib.suppress(msgspec.DecodeError):
                theirs[key] = _decoder.decode(value)
        self._theirs = theirs
        self._told_held = {node: held for node, held in self._told_held.items() if node in theirs}  # gone: forgotten
        self._sum()

    async def _tell(self, tenants: dict[str, Held]) -> None:
        self._said = tenants
        await self.nc.publish(HELD, _encoder.encode(TenantsHeld(node=self.node, tenants=tenants)))

    async def _told(self, msg: Msg) -> None:
        """Another node's tenants' counts: counted at once, over what its last put in the bucket says."""
        with contextlib.suppress(msgspec.DecodeError):
            told = _held_decoder.decode(msg.data)
            if told.node != self.node and told.tenants != self._told_held.get(told.node):
                self._told_held[told.node] = told.tenants
                self._sum()

    def _sum(self) -> None:
        others = Totals()
        for node in self._theirs.keys() | self._told_held.keys():
            totals = self._theirs.get(node, Totals())
            if (held := self._told_held.get(node)) is not None:
                totals = msgspec.structs.replace(totals, tenants=held)
            others = others.plus(totals)
        self.ledger.others = others
