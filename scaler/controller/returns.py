"""Returns from a lull, told across nodes: a function's followers may be on another node than it is.

The learned policy pre-warms a function when one it follows comes back (a `Cue`, Ledger.cues). Leader and
follower fall on the nodes their partitions do, so each node tells the others when one of its functions
comes back, and hears theirs (Ledger.hear): a follower of it here is cued, and a function of this node
coming back soon after learns it may follow it. The totals shared every second (scaler/controller/shared.py) come
too late for both: a follower is called within a second. Measured offline (bench/nodes.py): dataSet_1 on
four nodes sharing their totals 53.85, told of returns 54.30, as on one node.

Fire and forget, on core NATS: a return is worth something within a second or never, and one not heard
costs a pre-warm, nothing stored. The time a return is heard is this node's, as the other times it
compares it with are (a second node's clock may be off by more than a follower's lag).
"""

import contextlib
import logging
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from scaler.controller.core.decide import Decision
from scaler.controller.ledger import Ledger, came_back
from scaler.proto.commands import Cue
from scaler.proto.subjects import RETURNED
from scaler.runtime.clock import Clock

log = logging.getLogger("scaler.controller.returns")


class Returned(msgspec.Struct, frozen=True, kw_only=True):
    """A node's word to the others: its function `key` came back from a lull."""

    key: str
    node: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Returned)


class Returns:
    def __init__(self, nc: Client, node: str, ledger: Ledger, clock: Clock, cue: Callable[[list[Cue]], None]):
        self.nc = nc
        self.node = node
        self.ledger = ledger
        self.clock = clock
        self.cue = cue  # how the node decides the cues of what it heard (Controller._cue)
        self._sub = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(RETURNED, cb=self._heard)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def tell(self, decisions: list[Decision]) -> None:
        """Tell the other nodes of the functions these stored decisions brought back."""
        for d in decisions:
            if came_back(d):
                try:
                    await self.nc.publish(RETURNED, _encoder.encode(Returned(key=d.state.key, node=self.node)))
                except Exception as e:  # NATS away: the others miss one cue
                    log.debug("%s: its return was not told: %s", d.state.key, e)

    async def _heard(self, msg: Msg) -> None:
        try:
            returned = _decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            log.warning("a return told on %s cannot be read: %s", msg.subject, e)
            return
        if returned.node != self.node:
            self.cue(self.ledger.hear(returned.key, self.clock.now_ms()))
