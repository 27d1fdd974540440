"""Which partitions this node writes: leases in JetStream KV, shared fairly among the live nodes.

Every node heartbeats in one bucket and holds its partitions in another, both with entries that
expire unless renewed (`ttl_s`). Each round (every `every_s`) a node renews what it holds, counts
the live nodes, gives back what is above its fair share (ceil(partitions / nodes)) and takes free
partitions up to it. A node that dies stops renewing: its leases expire and the others take its
partitions within a few seconds.

Fencing, as Kubernetes' leader election does it: a node decides for a partition only while its
lease was renewed less than `deadline_s` ago (`fresh`), measured on its monotonic clock from the
moment it sent the renewal, so before the server can let the lease lapse (`ttl_s` from when it
got it), with a margin for a paused process and clock drift. A partition past its deadline is
dropped at once (`lost`), and a paused node (SIGSTOP) that wakes past its lease says so, once,
before it decides anything: the check is made by every command, whichever runs first on waking.
A lease that lapsed is never quietly taken back: another node may have written meanwhile, so it
is dropped and loaded anew. A node restarted under its name (`reclaim`: a name held by one live
process, scaler/runtime/identity.py) takes back the leases its dead incarnation held at once, by a
compare-and-set on their revision, and loads them anew, rather than waiting for them to lapse.
A renewal that got no answer (NATS froze with it on the way) may be stored later, at a revision the
node never learns; its next renewal is then refused, and the lease, still naming it, renewed at the
revision it has rather than taken for lapsed. What a snapshot claims is checked atomically by the lease's
revision (`confirm`: a compare-and-set renewal just before the snapshot is taken). Appends need no lease:
the expected-sequence check of every append (scaler/store/stream.py) makes a stale writer fail.

A round's renewals go as one atomic batch of compare-and-sets where the server takes them (2.12+): one synced
write and one ack a round rather than one per partition. A batch is all or nothing, and a refused one does not
say which lease moved, so the renewals are then sent each on its own, as on an older server.
"""

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from scaler.proto.subjects import PARTITIONS
from scaler.runtime.bus import answered
from scaler.runtime.kv import LISTING_WAIT_S, entries
from scaler.runtime.tasks import cancelled
from scaler.store import stream
from scaler.store.stream import WRONG_LAST_SEQUENCE, Append, Conflict, Rejected

log = logging.getLogger("scaler.controller.leases")

LEASES = "scaler_leases"  # p<N> -> the node that writes partition N
NODES = "scaler_nodes"  # <node> -> heartbeat
TTL_S = 4.0
EVERY_S = 1.0
HAND_OVER_S = 10.0  # how long a draining node waits for the other nodes to take its partitions
SEND_MARGIN_S = 0.5  # of a lease's TTL, left for a batch sent just before it to reach the server
STOP_ROUND_S = 2.0  # how long a stopping node lets a lease round under way finish


def renew_deadline(ttl_s: float) -> float:
    """How long after sending its last renewal a node still decides: a quarter of the lease (at least 1 s) is
    left for a pause between a decision and its answer, and for the server's clock running fast."""
    return ttl_s - max(1.0, ttl_s / 4)


async def bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int) -> KeyValue:
    """The bucket, created if missing (an existing one keeps its replicas: an operator may have raised them), once
    it answers: on a cluster a bucket's first writes find no responder until its stream has elected a leader."""
    try:
        kv = await js.key_value(name)
    except BucketNotFoundError:
        config = KeyValueConfig(bucket=name, ttl=ttl_s, history=1, storage=StorageType.FILE, replicas=replicas)
        kv = await js.create_key_value(config)
    await answered(kv.status)
    return kv


async def atomic_bucket(nc: Client, js: JetStreamContext, name: str) -> bool:
    """Let the bucket take atomic batches, where the server can (2.12+): whether it does."""
    if not stream.takes_atomic(nc):
        return False
    config = (await js.stream_info(f"KV_{name}")).config
    if config.allow_atomic:
        return True
    try:
        await js.update_stream(replace(config, allow_atomic=True))
    except APIError as e:  # a cluster with an older server in it: renewed one by one
        log.info("the %s bucket takes no atomic batches (%s): its leases are renewed one by one", name, e)
        return False
    return True


class Leases:
    def __init__(
        self,
        nc: Client,
        node: str,
        gained: Callable[[list[int]], Awaitable[None]],
        lost: Callable[[list[int]], Awaitable[None]],
        ttl_s: float = TTL_S,
        every_s: float = EVERY_S,
        replicas: int = 1,
        reclaim: bool = False,
        timeout_s: float = 5.0,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=timeout_s)
        self.timeout_s = timeout_s  # how long a request to the buckets waits for its answer
        self.node = node
        self.gained = gained  # called with partitions just leased: load them, then serve
        self.lost = lost  # called with partitions to stop serving, before their leases are given back
        self.ttl_s = ttl_s
        self.every_s = every_s
        self.replicas = replicas
        self.reclaim = reclaim  # `node` is held by this process alone (runtime/identity.py): take its leases back
        self.deadline_s = renew_deadline(ttl_s)
        self.about: Callable[[], bytes] = lambda: b""  # what its heartbeat says of the node (`scaler nodes`)
        self.refreshed: Callable[[], None] = lambda: None  # told when a lease renewed late is fresh again
        self.held: dict[int, int] = {}  # partition -> revision of our lease entry
        self.renewed: dict[int, float] = {}  # partition -> when its last renewal that succeeded was sent (monotonic)
        self.took: dict[int, float] = {}  # ... and how long that renewal took to be answered (s)
        self.tenure: dict[int, int] = {}  # partition -> which holding of it this is: new each time it is taken
        self._unanswered: set[int] = set()  # partitions with a renewal sent and never answered
        self._tenures = itertools.count(1)
        self._locks: dict[int, asyncio.Lock] = {}  # one renewal of a partition at a time
        self._leases: KeyValue | None = None
        self._atomic = False  # the lease bucket takes atomic batches: a round's renewals are one
        self._nodes: KeyValue | None = None
        self._task: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._leases = await bucket(self.js, LEASES, self.ttl_s, self.replicas)
        self._atomic = await atomic_bucket(self.nc, self.js, LEASES)
        self._nodes = await bucket(self.js, NODES, self.ttl_s, self.replicas)
        await self.round()
        self._task = asyncio.create_task(self._run())
        self._watch = asyncio.create_task(self._watch_deadlines())

    def fresh(self, p: int) -> bool:
        """Whether this node may decide for partition `p` now: it holds the lease and renewed it in time."""
        return p in self.held and time.monotonic() - self.renewed.get(p, -1e9) < self.deadline_s

    def sendable(self, p: int) -> bool:
        """Whether what this node decided for `p` (within its deadline) may still be sent: the lease held, and surely
        not yet lapsed at the server (which lets it go `ttl_s` after it stored the renewal, sent before that), with
        SEND_MARGIN_S for the message's way there. Past that, another node may be loading the partition."""
        return p in self.held and time.monotonic() - self.renewed.get(p, -1e9) < self.ttl_s - SEND_MARGIN_S

    def stale(self) -> list[int]:
        """Partitions held past their renewal deadline."""
        return [p for p in self.held if not self.fresh(p)]

    async def confirm(self, p: int, tenure: int | None = None) -> bool:
        """Renew `p`'s lease if it is still ours at the revision we hold (compare-and-set): whether it is, and
        fresh. After a True, nobody else wrote the partition since we took it, for `deadline_s` from now.
        With `tenure`, only within that holding of it: a lease lost and taken again since is another holding,
        and what this node held of the partition before is not what it holds now."""
        async with self._lock(p):
            revision = self.held.get(p)
            if revision is None or (tenure is not None and self.tenure.get(p) != tenure):
                return False
            sent = time.monotonic()
            try:
                self.held[p] = await self._update(p, revision)
            except Exception:  # lapsed and taken, or NATS away: not certain, so not ours
                return False
            self._renewed(p, sent)
            return self.fresh(p)

    async def stop(self) -> None:
        """Give everything back at once, so the other nodes need not wait for the leases to expire."""
        await self._stop_rounds()
        if self._nodes is None:  # its start failed before it held anything
            return
        # Each on its own (NATS away: they lapse instead): a heartbeat left behind would make the next
        # node count two and take half the partitions until it lapsed.
        await asyncio.gather(self.give_back(sorted(self.held)), self._beat_no_more(), return_exceptions=True)

    async def drain(self, patience_s: float = HAND_OVER_S) -> str:
        """Hand every partition to the other nodes and take none again; say what became of them.

        Each partition stops taking commands, finishes those under way, is snapshotted and released
        under its lease, and is freed.
        The heartbeat goes first: the other nodes then count one node less, so their fair share
        covers every partition given back and their next round takes them. Returns once another
        node holds them all (or none is up any more, or `patience_s` passed). With no other node up
        it does nothing: the stop then refuses new calls at once rather than hold them for a
        hand-over nobody takes.
        """
        try:
            alone = self._nodes is None or not await self.others()
        except Exception:  # NATS away: no hand-over can happen either
            alone = True
        if alone:
            return f"{self.node}: no other node is up to take its partitions"
        # As at a stop: no round renews a lease while it is being freed (a renewal landing after the hand-over
        # began would keep it), and none takes one again. Each snapshot confirms its lease just before.
        await self._stop_rounds()
        with contextlib.suppress(Exception):  # NATS away: the heartbeat lapses within the TTL
            await self._beat_no_more()
        given = sorted(self.held)
        await self.give_back(given)
        if not given:
            return f"{self.node} held no partition"
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            try:
                held = await holders(self.js)
                if all(held.get(p, self.node) != self.node for p in given):
                    takers = ", ".join(sorted({held[p] for p in given}))
                    return f"{self.node} handed partitions {ranges(given)} to {takers}"
                if not await self.others():
                    break
            except Exception as e:  # NATS away: the next owner finds the snapshots all the same
                log.warning("could not see who took partitions %s: %s", ranges(given), e)
                break
            await asyncio.sleep(0.05)
        return f"{self.node} gave back partitions {ranges(given)}; no other node took them yet"

    async def _beat_no_more(self) -> None:
        """Remove this node's heartbeat, leaving no delete marker behind: `live` would count one."""
        await self.js.purge_stream(f"KV_{NODES}", subject=f"$KV.{NODES}.{self.node}")

    async def _stop_rounds(self) -> None:
        """No more lease rounds. One under way is let finish (for a moment): cut short, its renewals may be
        stored at revisions this node never learns, and freeing those leases would need another look."""
        await cancelled(self._watch)
        self._stopping.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=STOP_ROUND_S)
        await cancelled(self._task)

    async def others(self) -> list[str]:
        """The other live nodes, by their heartbeats; asked again for a moment while JetStream cannot answer (a
        drain during a server's reload), where a lease round just tries again at the next."""
        return [n for n in await answered(lambda: live(self.js), LISTING_WAIT_S) if n != self.node]

    async def _run(self) -> None:
        failing = 0
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.every_s)
            if self._stopping.is_set():
                return
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
        return max(1, len(await live(self.js)))

    async def round(self) -> None:
        await self._nodes.put(self.node, self.about())
        await self._renew()
        share = math.ceil(PARTITIONS / await self.live_nodes())
        if len(self.held) > share:
            await self.give_back(sorted(self.held)[share:])
        elif len(self.held) < share:
            await self._take(share - len(self.held))

    async def _renew(self) -> None:
        """All at once: one after another, a round under load (each update synced to disk, behind a busy
        connection) took longer than the renewal deadline. As one atomic batch where the bucket takes them;
        each on its own when it does not, or when that batch is refused."""
        held = list(self.held)
        if self._atomic and len(held) > 1 and await self._renew_together(held):
            return
        kept = await asyncio.gather(*(self._renew_one(p) for p in held))
        if lapsed := [p for p, ok in zip(held, kept, strict=True) if not ok]:
            await self._drop(lapsed, "their leases lapsed")

    async def _renew_one(self, p: int) -> bool:
        """Renew partition `p`'s lease if still held; False if it lapsed."""
        async with self._lock(p):
            if (revision := self.held.get(p)) is None:
                return True
            sent = time.monotonic()
            try:
                self.held[p] = await self._update(p, revision)
            except KeyWrongLastSequenceError:  # moved since: it lapsed, and another node may have written
                if p not in self._unanswered:  # meanwhile, or by a renewal of ours whose answer never came
                    return False
                sent = time.monotonic()
                if (revision := await self._still_ours(p)) is None:
                    return False
                self.held[p] = revision
            self._renewed(p, sent)
            return True

    async def _renew_together(self, held: list[int]) -> bool:
        """Renew every lease in `held` in one atomic batch of compare-and-sets: True once stored, False when
        refused (a lease moved since, and JetStream does not say which; or the bucket took no batch, its
        configuration changed by hand, say). One that gets no answer may yet be stored: each of its leases is
        then unanswered, as a renewal of its own would be."""
        async with contextlib.AsyncExitStack() as locks:
            for p in sorted(held):
                await locks.enter_async_context(self._lock(p))
            revisions = {p: self.held[p] for p in held if p in self.held}
            earlier = self._unanswered & revisions.keys()
            self._unanswered |= revisions.keys()
            name = self.node.encode()
            renewals = [Append(lease_subject(p), name, lease_subject(p), r) for p, r in revisions.items()]
            sent = time.monotonic()
            try:
                stored = await stream.atomic(self.nc, renewals, self.timeout_s)
            except (Conflict, Rejected):
                self._unanswered -= revisions.keys() - earlier
                return False
            for p, revision in zip(revisions, stored, strict=True):
                self._unanswered.discard(p)
                if p in self.held:
                    self.held[p] = revision
                    self._renewed(p, sent)
            return True

    async def _update(self, p: int, revision: int) -> int:
        """Renew `p`'s lease at `revision`. One that gets no answer (NATS froze with it on the way) may yet be
        stored, at a revision this node never learns: remembered until one is stored. A refusal is an answer."""
        earlier = p in self._unanswered
        self._unanswered.add(p)
        try:
            revision = await self._leases.update(f"p{p}", self.node.encode(), last=revision)
        except KeyWrongLastSequenceError:
            if not earlier:
                self._unanswered.discard(p)
            raise
        self._unanswered.discard(p)
        return revision

    async def _watch_deadlines(self) -> None:
        """Drop the partitions past their renewal deadline (NATS away, or this process was paused)."""
        while True:
            await asyncio.sleep(min(self.every_s, self.deadline_s) / 4)
            late = [p for p in self.stale() if not self._lock(p).locked()]  # a renewal under way settles the rest
            if late:
                ago = time.monotonic() - min(self.renewed.get(p, 0.0) for p in late)
                await self._drop(late, f"their leases were last renewed {ago:.1f}s ago (paused, or cut off from NATS)")

    async def _drop(self, partitions: list[int], why: str) -> None:
        """Stop deciding for partitions whose lease is no longer certainly ours; said once, in one line."""
        partitions = [p for p in partitions if p in self.held]
        if not partitions:
            return
        log.warning("%s no longer decides for partitions %s: %s", self.node, ranges(sorted(partitions)), why)
        for p in partitions:
            del self.held[p]
            self._forget(p)
        await self.lost(partitions)

    def _renewed(self, p: int, sent: float) -> None:
        late = not self.fresh(p)
        self.renewed[p], self.took[p] = sent, time.monotonic() - sent
        if late and self.fresh(p):
            self.refreshed()

    def _forget(self, p: int) -> None:
        """What this node knew of its holding of `p`, now ended."""
        self.renewed.pop(p, None)
        self.tenure.pop(p, None)
        self._unanswered.discard(p)

    def _lock(self, p: int) -> asyncio.Lock:
        return self._locks.setdefault(p, asyncio.Lock())

    async def _take(self, wanted: int) -> None:
        """Lease up to `wanted` more partitions, one after another; those taken are loaded even when a later one
        fails (NATS not answering): held and renewed, they would otherwise never be loaded, nor taken again."""
        taken, reclaimed = [], []
        try:
            for p in range(PARTITIONS):
                if len(taken) == wanted:
                    break
                if p in self.held:
                    continue
                sent = time.monotonic()
                try:
                    self.held[p] = await self._leases.create(f"p{p}", self.node.encode())
                except KeyWrongLastSequenceError:  # someone holds it: an earlier incarnation of this node, maybe
                    if (revision := await self._reclaimed(p)) is None:
                        continue
                    self.held[p] = revision
                    reclaimed.append(p)
                self._renewed(p, sent)
                self.tenure[p] = next(self._tenures)
                taken.append(p)
        finally:
            if reclaimed:
                log.info("%s took back partitions %s from its earlier incarnation", self.node, ranges(reclaimed))
            if taken:
                log.info("%s leased partitions %s", self.node, ranges(taken))
                await self.gained(taken)

    async def _reclaimed(self, p: int) -> int | None:
        """Take `p`'s lease back from this node's earlier incarnation, which is dead (the name is held by this
        process alone). The new revision, or None."""
        return await self._still_ours(p) if self.reclaim else None

    async def _still_ours(self, p: int) -> int | None:
        """Renew `p`'s lease at the revision it has, if it names this node: then nobody else held it since, as
        only this node writes its name (and, under `reclaim`, its dead incarnation), each time by a compare-and-set
        on a revision of its own. A compare-and-set again, so a lease another node took meanwhile stays theirs.
        The new revision, or None."""
        try:
            entry = await self._leases.get(f"p{p}")
            if entry.value != self.node.encode():
                return None
            return await self._update(p, entry.revision)
        except (KeyNotFoundError, KeyWrongLastSequenceError):  # lapsed or taken meanwhile: the next round sees
            return None

    async def give_back(self, partitions: list[int]) -> None:
        """Stop serving them, then free their leases for another node."""
        partitions = [p for p in partitions if p in self.held]
        if not partitions:
            return
        await self.lost(partitions)
        freed = [(p, self.held.pop(p)) for p in partitions if p in self.held]
        for p, _ in freed:
            self._forget(p)
        # All at once and each on its own: one that times out (NATS slow or away) lapses after the TTL,
        # and does not keep the others held until then, nor the stop waiting a timeout per partition.
        results = await asyncio.gather(*(self._free(p, revision) for p, revision in freed), return_exceptions=True)
        stuck = {p: r for (p, _), r in zip(freed, results, strict=True) if isinstance(r, Exception)}
        if stuck:
            why = next(iter(stuck.values()))
            log.warning(
                "could not free the leases of partitions %s (%s: %s); they lapse within %gs",
                ranges(sorted(stuck)), type(why).__name__, why, self.ttl_s,
            )  # fmt: skip
        log.info("%s gave back partitions %s", self.node, ranges(partitions))

    async def _free(self, p: int, revision: int) -> None:
        """Delete `p`'s lease if it is still ours: at the revision we know, or, when a renewal was stored
        without our learning its revision, at the one it has while it still names this node."""
        try:
            await self._leases.delete(f"p{p}", last=revision)
            return
        except APIError as e:
            if e.err_code != WRONG_LAST_SEQUENCE:
                raise
        try:
            entry = await self._leases.get(f"p{p}")
        except KeyNotFoundError:  # lapsed (or deleted) meanwhile: nothing to free
            return
        if entry.value == self.node.encode():
            with contextlib.suppress(APIError):  # taken just now by another node: it is theirs
                await self._leases.delete(f"p{p}", last=entry.revision)


def lease_subject(p: int) -> str:
    """The subject of partition `p`'s lease in its bucket's stream."""
    return f"$KV.{LEASES}.p{p}"


async def live(js: JetStreamContext) -> list[str]:
    """The nodes with a heartbeat: the keys of their bucket, asked of its stream. One request, answered by the
    stream's leader, every round, where a listing (scaler/runtime/kv.py) makes and drops a consumer."""
    info = await js.stream_info(f"KV_{NODES}", subjects_filter=f"$KV.{NODES}.>")
    return [subject.removeprefix(f"$KV.{NODES}.") for subject in info.state.subjects or {}]


async def holders(js: JetStreamContext) -> dict[int, str]:
    """Who holds each leased partition now."""
    try:
        listed = await entries(js, LEASES)
    except NotFoundError:  # no lease bucket: no node has started
        return {}
    return {int(key[1:]): node.decode() for key, node in listed.items()}


def ranges(partitions: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; [] -> 'none'."""
    if not partitions:
        return "none"
    out, start = [], None
    for a, b in zip(partitions, [*partitions[1:], None], strict=True):
        start = a if start is None else start
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else f"{a}")
            start = None
    return ", ".join(out)
