"""The running controllers' state, on request over core NATS: what `scaler replay --verify` compares with.

A request on `scaler.controller.state` is answered by every running controller with a consistent
copy of what it serves (FnState is immutable, so a shallow copy of the dicts is a point-in-time
view), in as many messages as the server's payload limit needs, the last one marked `more=False`.
The asker knows whom to expect from the lease bucket: every node that holds a partition.
"""

import asyncio
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from controller.core.state import FnState
from controller.leases import holders
from controller.snapshots import Snapshot

SUBJECT = "scaler.controller.state"
_ENVELOPE = 1024  # bytes kept free in each message for everything but the states


class _Chunk(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    seq: int
    last_seq: dict[str, int]
    states: dict[str, msgspec.Raw]
    more: bool


class StateChunk(msgspec.Struct, frozen=True, kw_only=True):
    """What the controllers hold. `seq`: every batch at or below it is in the states (the lowest of the
    nodes' watermarks); `last_seq` says which ones above are."""

    seq: int
    last_seq: dict[str, int]
    states: dict[str, FnState]
    node: str = ""
    more: bool = False


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StateChunk)


def chunks(snap: Snapshot, max_bytes: int, node: str = "") -> list[bytes]:
    """The snapshot as messages of at most `max_bytes` each (a single state larger than that goes alone)."""
    out: list[bytes] = []
    states: dict[str, msgspec.Raw] = {}
    size = _ENVELOPE

    def flush(more: bool) -> None:
        nonlocal states, size
        last = {k: snap.last_seq[k] for k in states if k in snap.last_seq}
        out.append(_encoder.encode(_Chunk(node=node, seq=snap.seq, last_seq=last, states=states, more=more)))
        states, size = {}, _ENVELOPE

    for key, state in snap.states.items():
        body = _encoder.encode(state)
        cost = len(body) + 2 * len(key.encode()) + 16
        if states and size + cost > max_bytes:
            flush(more=True)
        states[key] = msgspec.Raw(body)
        size += cost
    flush(more=False)
    return out


async def serve(nc: Client, node: str, take: Callable[[], Snapshot]) -> Subscription:
    async def answer(msg: Msg) -> None:
        if not msg.reply:
            return
        for body in chunks(take(), nc.max_payload, node):
            await nc.publish(msg.reply, body)

    return await nc.subscribe(SUBJECT, cb=answer)


async def fetch(nc: Client, timeout_s: float = 10.0) -> StateChunk:
    """Ask the running controllers for their state; TimeoutError when one holding partitions does not answer."""
    expected = set((await holders(nc.jetstream())).values())
    inbox = nc.new_inbox()
    parts: asyncio.Queue[Msg] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        parts.put_nowait(msg)

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(SUBJECT, b"", reply=inbox)
        seqs, last_seq, states, done = [], {}, {}, set()
        async with asyncio.timeout(timeout_s):
            while not expected or not expected <= done:
                msg = await parts.get()
                if not msg.data:  # the server's "no responders" status: no controller is running
                    raise TimeoutError("no controller")
                chunk = _decoder.decode(msg.data)
                last_seq.update(chunk.last_seq)
                states.update(chunk.states)
                if not chunk.more:
                    seqs.append(chunk.seq)
                    done.add(chunk.node)
                    if not expected:  # no lease bucket: a single controller, whoever answers
                        break
        return StateChunk(seq=min(seqs), last_seq=last_seq, states=states)
    finally:
        await sub.unsubscribe()
