"""The run's totals across nodes: each node says what its partitions add up to, and hears the others.

The learned policy values waiting at an exchange rate taken from the whole run's totals (execution,
waiting, the idle a clairvoyant scaler would pay). A node holds only some partitions, so each one
tells the others its totals every second (core NATS, `scaler.totals`: a few kB whatever the number of
functions) and adds up what they told. Measured offline (`bench/nodes.py`): with the totals split over
four nodes the learned policy lost 5 points on a mixed trace; shared, it decides as one node does. A
node's totals are forgotten `ttl_s` (the lease TTL) after its last word, and a partition's totals move
with it, so a dead node's are not counted twice for longer than that. A word missed is repaired by the
next; nothing is stored, and nothing is listed: listing a KV bucket makes and drops a JetStream
consumer, every second on every node.

What a tenant's functions hold (Totals.tenants, what its quotas count) cannot wait a second: two nodes
would start past a quota meanwhile. So a node also tells the others its tenants' counts the moment they
change, and again at each exchange (`scaler.tenants.held`: in order from each node, so its last word is
its newest), and the others count them at once. Two nodes starting for one tenant within the same few
milliseconds may still pass its quota by one instance each; a node dead holds its count until it is
forgotten, so a quota is held too tightly for that while, never too loosely.
"""

import asyncio
import contextlib
import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scaler.controller.core.state import Held
from scaler.controller.core.totals import Totals
from scaler.controller.ledger import Ledger
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.shared")

TOTALS = "scaler.totals"  # a node's totals, every exchange
HELD = "scaler.tenants.held"  # a node's tenants' counts, told as they change
TELL_EVERY_S = 0.02  # at most one word of a node's tenants' counts this often: a burst of changes is told once
_encoder = msgspec.msgpack.Encoder()


class NodeTotals(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    totals: Totals


class TenantsHeld(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    tenants: dict[str, Held]


_totals_decoder = msgspec.msgpack.Decoder(NodeTotals)
_held_decoder = msgspec.msgpack.Decoder(TenantsHeld)


class SharedTotals:
    def __init__(self, nc: Client, node: str, ledger: Ledger, ttl_s: float, every_s: float):
        self.nc = nc
        self.node = node
        self.ledger = ledger  # the node's ledger: its totals go out, the others' come in
        self.ttl_s = ttl_s
        self.every_s = every_s
        self._task: asyncio.Task | None = None
        self._subs: list[Subscription] = []
        self._theirs: dict[str, tuple[Totals, float]] = {}  # by node: the totals it last told, and when (loop time)
        self._told_held: dict[str, dict[str, Held]] = {}  # by node: its tenants' counts as it last told them
        self._moved = asyncio.Event()  # set by the ledger when this node's tenants' counts change
        self._said: dict[str, Held] | None = None  # the counts this node last told

    async def start(self) -> None:
        self._subs = [await self.nc.subscribe(TOTALS, cb=self._heard), await self.nc.subscribe(HELD, cb=self._told)]
        self.ledger.tenants_moved = self._moved.set
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop telling, and say so: the others count nothing for this node from now on (its partitions' totals
        go with them to their next holder)."""
        self.ledger.tenants_moved = lambda: None
        await cancelled(self._task)
        with contextlib.suppress(Exception):  # NATS away: the others forget this node `ttl_s` after its last word
            await self.nc.publish(TOTALS, _encoder.encode(NodeTotals(node=self.node, totals=Totals())))
            await self._tell({})
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

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
        """Tell this node's totals, and forget the nodes not heard from for `ttl_s` (dead, or cut off)."""
        totals = self.ledger.totals
        await self.nc.publish(TOTALS, _encoder.encode(NodeTotals(node=self.node, totals=totals)))
        await self._tell(totals.tenants)
        since = asyncio.get_running_loop().time() - self.ttl_s
        self._theirs = {node: heard for node, heard in self._theirs.items() if heard[1] >= since}
        self._told_held = {node: held for node, held in self._told_held.items() if node in self._theirs}
        self._sum()

    async def _tell(self, tenants: dict[str, Held]) -> None:
        self._said = tenants
        await self.nc.publish(HELD, _encoder.encode(TenantsHeld(node=self.node, tenants=tenants)))

    async def _heard(self, msg: Msg) -> None:
        """Another node's totals, as of its last exchange."""
        with contextlib.suppress(msgspec.DecodeError):
            heard = _totals_decoder.decode(msg.data)
            if heard.node != self.node:
                self._theirs[heard.node] = (heard.totals, asyncio.get_running_loop().time())
                self._sum()

    async def _told(self, msg: Msg) -> None:
        """Another node's tenants' counts: counted at once, over what its last totals said."""
        with contextlib.suppress(msgspec.DecodeError):
            told = _held_decoder.decode(msg.data)
            if told.node != self.node and told.tenants != self._told_held.get(told.node):
                self._told_held[told.node] = told.tenants
                self._sum()

    def _sum(self) -> None:
        others = Totals()
        for node in self._theirs.keys() | self._told_held.keys():
            totals = self._theirs[node][0] if node in self._theirs else Totals()
            if (held := self._told_held.get(node)) is not None:
                totals = msgspec.structs.replace(totals, tenants=held)
            others = others.plus(totals)
        self.ledger.others = others
