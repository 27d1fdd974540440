"""The run's totals across nodes: each node says what its partitions add up to, and hears the others.

The learned policy values waiting at an exchange rate taken from the whole run's totals (execution,
waiting, the idle a clairvoyant scaler would pay). A node holds only some partitions, so each one
puts its totals in a KV bucket every second and adds up the others'. Measured offline
(`bench/nodes.py`): with the totals split over four nodes the learned policy lost 5 points on a
mixed trace; shared, it decides as one node does. An entry expires with its node (the lease TTL),
and a partition's totals move with it, so a dead node's are not counted twice for longer than that.
"""

import asyncio
import contextlib
import logging

import msgspec
from nats.js import JetStreamContext

from scaler.controller.core.state import Totals
from scaler.controller.leases import bucket
from scaler.controller.ledger import Ledger
from scaler.runtime.kv import entries
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.shared")

BUCKET = "scaler_totals"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Totals)


class SharedTotals:
    def __init__(self, js: JetStreamContext, node: str, ledger: Ledger, ttl_s: float, every_s: float, replicas: int):
        self.js = js
        self.node = node
        self.ledger = ledger  # the node's ledger: its totals go out, the others' come in
        self.ttl_s = ttl_s
        self.every_s = every_s
        self.replicas = replicas
        self._kv = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._kv = await bucket(self.js, BUCKET, self.ttl_s, self.replicas)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)
        with contextlib.suppress(Exception):
            await self._kv.delete(self.node)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # NATS away: the totals are a little older, that is all
                await self.exchange()
            await asyncio.sleep(self.every_s)

    async def exchange(self) -> None:
        await self._kv.put(self.node, _encoder.encode(self.ledger.totals))
        others = Totals()
        for key, value in (await entries(self.js, BUCKET)).items():
            if key == self.node:
                continue
            with contextlib.suppress(msgspec.DecodeError):
                others = others.plus(_decoder.decode(value))
        self.ledger.others = others
