"""Clocks at a take-over: the times a partition's state holds, moved onto the clock of the node that loads it.

Every batch carries its writer's wall-clock `at_ms`, and the state keeps times from them (a busy
instance's lease, a keep-alive, a waiting request, the releases' window, the last arrival that rest
and forgetting count from). A node that loads a partition another node wrote must not compare those
with its own clock: a writer 120 s behind makes every lease look 120 s older. The common reference is
the NATS server's clock, which stamps every stored message: a batch's `at_ms` less its server stamp is
its writer's offset, and this node's own offset is read the same way off its lease entry. A function
whose writer's offset differs from this node's by more than SKEW_TOLERANCE_MS gets one `ClockRebased`
batch at load, before the partition serves, so the state stays a fold of the stream (replay = state).
Without a reference (the stamp unreadable), only a stamp from the future is moved back to now: elapsed
time before the load is then forgotten, never invented. docs/faults.md, "Clocks at a take-over".
"""

import asyncio
import logging
import time

from nats.js import JetStreamContext

from scaler.controller.ledger import Ledger
from scaler.proto.events import Batch, ClockRebased, decode_batch
from scaler.proto.subjects import EVENTS
from scaler.runtime.text import plural
from scaler.store.stream import WRITER

log = logging.getLogger("scaler.controller")

SKEW_TOLERANCE_MS = 1_000  # NTP keeps honest clocks well within it; a larger offset is a skew, moved and said
REBASE_CAUSE = "rebase"  # the cause of a ClockRebased batch: no command caused it, the load did
_LOOKUPS = 32  # server stamps of functions' last batches looked up at once


class Clocks:
    """What the stream says of its writers' clocks, as batches are read: who wrote each function's last batch, when
    by its clock, and each writer's offset from the server's clock.

    A batch is stamped by the server when stored, which may be long after its writer decided it (a store that stood
    still, an append tried again): a late batch makes its writer look behind. So a writer's offset is the largest
    any of its batches shows (the least delayed), and a batch this node wrote itself needs none."""

    def __init__(self, node: str = "") -> None:
        self.node = node  # this node's name: what it wrote is on its own clock
        self.writers: dict[str, tuple[int, str]] = {}  # key -> (its last batch's at_ms, who wrote it)
        self.offsets: dict[str, int] = {}  # writer -> its offset from the server's clock

    def heard(self, batch: Batch, server_ms: int, writer: str = "") -> None:
        """A batch read from the stream, which the server stamped at `server_ms` and `writer` wrote ("": a batch
        written before batches said who wrote them: its function then stands for its writer)."""
        writer = writer or f"?{batch.key}"
        offset = batch.at_ms - server_ms
        self.writers[batch.key] = (batch.at_ms, writer)
        self.offsets[writer] = max(offset, self.offsets.get(writer, offset))

    def forget(self, keys: list[str]) -> None:
        for key in keys:
            self.writers.pop(key, None)

    async def look_up(self, js: JetStreamContext, ledger: Ledger, keys: list[str]) -> None:
        """The writers of those functions' last batches that no read passed on (a snapshot holds them): looked up
        by sequence, for the functions holding something a time bounds only (an instance, a request waiting, a
        release a late retry may still come for): a function at rest keeps only its features."""
        wanted = [
            (k, seq)
            for k in keys
            if k not in self.writers
            and (seq := ledger.last_seq.get(k, 0))
            and (s := ledger.states.get(k)) is not None
            and (s.instances or s.queue or s.finished)
        ]
        gate = asyncio.Semaphore(_LOOKUPS)

        async def one(key: str, seq: int) -> None:
            async with gate:
                try:
                    msg = await js.get_msg(EVENTS, seq)
                    batch = decode_batch(msg.data)
                except Exception:  # retention dropped it, or the server is away: no reference for it
                    return
                if msg.time is not None and batch.key == key:
                    self.heard(batch, round(msg.time.timestamp() * 1000), (msg.headers or {}).get(WRITER, ""))

        await asyncio.gather(*(one(k, seq) for k, seq in wanted))

    def shift(self, key: str, newest_ms: int, own_offset_ms: int | None, now: int) -> int:
        """How far the function's times are to move onto this node's clock (0: they are on it already).

        `newest_ms`: the newest time it holds, when its writer is unknown; `own_offset_ms`: this node's offset
        from the server's clock (None: unknown)."""
        at, writer = self.writers.get(key, (newest_ms, None))
        offset = self.offsets.get(writer) if writer not in (None, self.node) else None
        shift = 0
        if offset is not None and own_offset_ms is not None and abs(own_offset_ms - offset) > SKEW_TOLERANCE_MS:
            shift = own_offset_ms - offset
        if at + shift > now + SKEW_TOLERANCE_MS:  # still from the future: the time before the load is forgotten
            shift = now - at
        return shift


async def own_offset(js: JetStreamContext, bucket: str, revision: int, sent_ms: int, took_ms: int) -> int | None:
    """This node's offset from the server's clock (ms): its entry at `revision` of KV bucket `bucket`, sent at
    `sent_ms` on this node's clock and answered `took_ms` later, less the server's stamp of it (taken as stamped
    half-way). None when the entry cannot be read, or its write took longer than the tolerance: the server may have
    stamped it at any time in between (a store that stood still), so it says nothing of the clocks."""
    if took_ms > SKEW_TOLERANCE_MS:
        return None
    try:
        msg = await js.get_msg(f"KV_{bucket}", revision)
    except Exception:
        return None
    return None if msg.time is None else sent_ms + took_ms // 2 - round(msg.time.timestamp() * 1000)


def ms_at(now_ms: int, monotonic_s: float) -> int:
    """The node's clock (`now_ms` now) when the monotonic clock read `monotonic_s` (at speed 1)."""
    return now_ms - round((time.monotonic() - monotonic_s) * 1000)


def newest(ledger: Ledger, key: str) -> int:
    """The newest time the function's state and features hold that a node stamped when it happened (a deadline it
    set is in the future by design and left out)."""
    s = ledger.states.get(key)
    if s is None:
        return 0
    f = ledger.features_of(key)
    times = [f.last_arrival_ms, f.last_end_ms]
    times += [max(i.since_ms, i.wanted_ms) for i in s.instances.values()]
    times += [p.since_ms for p in s.queue]
    if (last := s.last_release()) is not None:
        times.append(last.at_ms)
    return max(times)


def rebase_batch(ledger: Ledger, key: str, shift_ms: int, now: int) -> Batch:
    """The function's ClockRebased batch; its next deadline (the last batch's, on the writer's clock) moved too."""
    wake = ledger.wake.get(key)
    return Batch(
        key=key,
        at_ms=now,
        cause=REBASE_CAUSE,
        events=[ClockRebased(at_ms=now, shift_ms=shift_ms)],
        wake_ms=wake + shift_ms if wake is not None else None,
    )


def said(partitions: str, shifts: dict[str, int]) -> str:
    """One line for a load that moved times: how many functions, and how far their writers' clocks were off."""
    behind = [s for s in shifts.values() if s > 0]
    ahead = [-s for s in shifts.values() if s < 0]
    parts = []
    if behind:
        parts.append(f"{plural(len(behind), 'function')} written on a clock up to {max(behind) / 1000:.1f} s behind it")
    if ahead:
        parts.append(f"{plural(len(ahead), 'function')} written on a clock up to {max(ahead) / 1000:.1f} s ahead of it")
    return f"partitions {partitions}: times moved onto this node's clock, of {' and '.join(parts)}"


def own_said(node: str, offset_ms: int) -> str:
    """One line for a node whose own clock is off the server's."""
    how = "behind" if offset_ms < 0 else "ahead of"
    return f"{node}'s clock is {abs(offset_ms) / 1000:.1f} s {how} the NATS server's: is NTP running on both?"
