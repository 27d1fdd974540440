"""The running controllers' state, on request over core NATS: what `scaler replay --verify` compares with.

A request on `scaler.controller.state` is answered by every running controller with a consistent
copy of the partitions it serves, loaded (FnState is immutable, so a shallow copy of the dicts is a
point-in-time view), in as many messages as the server's payload limit needs, the last one marked
`more=False`, and which partitions those are. The asker knows whom to expect from the lease bucket:
every node that holds a partition. A node may hold a partition it has not loaded yet (taken over a
moment ago, or refused): the answer says so, rather than leaving its functions out unnoticed.

A request may name partitions (a msgpack list): then only their holders are waited for, and each node
answers with those it serves alone: how one function's state is read from its owner (scaler.Admin's
per-instance stats), as a restart is passed on to it.
"""

import asyncio
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState
from scaler.controller.leases import holders
from scaler.controller.snapshots import Snapshot
from scaler.proto.subjects import partition

SUBJECT = "scaler.controller.state"
_ENVELOPE = 1024  # bytes kept free in each message for everything but the states


class _Chunk(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    seq: int
    last_seq: dict[str, int]
    states: dict[str, msgspec.Raw]
    more: bool
    serving: list[int]
    features: dict[str, msgspec.Raw] = {}  # each function's features beside its state, in the same message


class StateChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a node's answer: `serving` are the partitions whose functions its messages carry."""

    seq: int
    last_seq: dict[str, int]
    states: dict[str, FnState]
    node: str = ""
    more: bool = False
    serving: list[int] = []
    features: dict[str, FnStats] = {}


class Running(msgspec.Struct, frozen=True, kw_only=True):
    """What the running controllers hold. `seq`: every batch at or below it is in the states (the lowest of the
    nodes' watermarks); `last_seq` says which ones above are. `unserved`: partitions held by a node that has not
    loaded them (or that did not answer for them): their functions are not in `states`."""

    seq: int
    last_seq: dict[str, int]
    states: dict[str, FnState]
    unserved: list[int] = []
    features: dict[str, FnStats] = {}  # the functions' features (those that learned something), by key


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StateChunk)


def chunks(snap: Snapshot, max_bytes: int, node: str = "", serving: list[int] | None = None) -> list[bytes]:
    """The snapshot as messages of at most `max_bytes` each (a single state larger than that goes alone).

    `serving`: the partitions the snapshot is of (by default, those of its functions)."""
    serving = sorted({partition(k) for k in snap.states}) if serving is None else serving
    out: list[bytes] = []
    states: dict[str, msgspec.Raw] = {}
    learned: dict[str, msgspec.Raw] = {}
    size = _ENVELOPE

    def flush(more: bool) -> None:
        nonlocal states, learned, size
        last = {k: snap.last_seq[k] for k in states if k in snap.last_seq}
        chunk = _Chunk(
            node=node, seq=snap.seq, last_seq=last, states=states, more=more, serving=serving, features=learned
        )
        out.append(_encoder.encode(chunk))
        states, learned, size = {}, {}, _ENVELOPE

    for key, state in snap.states.items():
        body = _encoder.encode(state)
        features = _encoder.encode(snap.features[key]) if key in snap.features else None
        cost = len(body) + (len(features) if features is not None else 0) + 3 * len(key.encode()) + 24
        if states and size + cost > max_bytes:
            flush(more=True)
        states[key] = msgspec.Raw(body)
        if features is not None:
            learned[key] = msgspec.Raw(features)
        size += cost
    flush(more=False)
    return out


class Serving:
    """Answers with `take(partitions)` of the partitions in `serving` (the node's live set) at the time of asking."""

    def __init__(self, nc: Client, node: str, take: Callable[[set[int]], Snapshot], serving: set[int]) -> None:
        self.nc = nc
        self.node = node
        self.take = take
        self.serving = serving
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(SUBJECT, cb=self._answer)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _answer(self, msg: Msg) -> None:
        if not msg.reply:
            return
        now = set(self.serving)
        if msg.data:
            now &= set(msgspec.msgpack.decode(msg.data, type=list[int]))
        for body in chunks(self.take(now), self.nc.max_payload, self.node, sorted(now)):
            await self.nc.publish(msg.reply, body)


async def fetch(
    nc: Client, timeout_s: float = 10.0, serve_s: float = 0.0, partitions: set[int] | None = None
) -> Running:
    """Ask the running controllers for their state; TimeoutError when one holding partitions does not answer.

    Each node's functions are taken only from the partitions it both holds and serves; those held and not
    served by their holder are `unserved`. While some are, or a holder does not answer, ask again for up to
    `serve_s` (a node taking over loads its partitions in a moment; one refused stays unserved). `partitions`:
    those alone (by default, all)."""
    until = asyncio.get_running_loop().time() + serve_s
    while True:
        try:
            running = await _ask(nc, timeout_s, partitions)
        except TimeoutError:
            if asyncio.get_running_loop().time() >= until:
                raise
        else:
            if not running.unserved or asyncio.get_running_loop().time() >= until:
                return running
        await asyncio.sleep(0.2)


async def _ask(nc: Client, timeout_s: float, partitions: set[int] | None = None) -> Running:
    held = await holders(nc.jetstream())
    if partitions is not None:
        held = {p: node for p, node in held.items() if p in partitions}
    expected = set(held.values())
    inbox = nc.new_inbox()
    parts: asyncio.Queue[Msg] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        parts.put_nowait(msg)

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        asked = b"" if partitions is None else msgspec.msgpack.encode(sorted(partitions))
        await nc.publish(SUBJECT, asked, reply=inbox)
        seqs, last_seq, states, learned, served, done = [], {}, {}, {}, set(), set()
        async with asyncio.timeout(timeout_s):
            while not expected or not expected <= done:
                msg = await parts.get()
                if not msg.data:  # the server's "no responders" status: no controller is running
                    raise TimeoutError("no controller")
                chunk = _decoder.decode(msg.data)
                mine = {p for p in chunk.serving if held.get(p, chunk.node) == chunk.node}
                states.update((k, v) for k, v in chunk.states.items() if partition(k) in mine)
                learned.update((k, v) for k, v in chunk.features.items() if partition(k) in mine)
                last_seq.update((k, v) for k, v in chunk.last_seq.items() if partition(k) in mine)
                if not chunk.more:
                    seqs.append(chunk.seq)
                    served |= mine
                    done.add(chunk.node)
                    if not expected:  # no lease bucket: a single controller, whoever answers
                        break
        unserved = sorted(set(held) - served)
        return Running(seq=min(seqs), last_seq=last_seq, states=states, unserved=unserved, features=learned)
    finally:
        await sub.unsubscribe()
