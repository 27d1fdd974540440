"""The partitions a node serves: leased (scaler/controller/leases.py), loaded, served, and given up.

One gained is loaded from its snapshot and the batches after it (scaler/controller/rebuild.py), then its
commands and its workers' reports are taken (`cmd.<partition>`, `report.<partition>`: one node of the queue
group answers each) and the node is told (`served`). One lost stops taking commands at once; the commands
under way finish, the node is told (`released`: it snapshots and forgets), and the lease is given back.

One that cannot be rebuilt exactly (retention cut the stream, and no snapshot covers the cut) is
refused, said once: the node keeps its lease, so nobody loads it again every round, and answers
each of its commands with why (calls FAILED_PRECONDITION; reports UNAVAILABLE, so workers keep
them for when it can be loaded). The other partitions are served as usual.
"""

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from scaler.controller import clocks, rebuild
from scaler.controller.clocks import Clocks
from scaler.controller.core.limits import NO_LIMITS, Limits
from scaler.controller.leases import EVERY_S, LEASES, TTL_S, Leases, ranges
from scaler.controller.ledger import Ledger
from scaler.controller.snapshots import SnapshotStore
from scaler.controller.snapshotter import Snapshotter
from scaler.proto.commands import OPERATOR, Assign, Code, Idle, Reply, decode_command, encode
from scaler.proto.events import encode_batch
from scaler.proto.subjects import CMD, PARTITIONS, REPORT, event_subject, function_events, partition
from scaler.runtime.bus import Unavailable
from scaler.runtime.clock import Clock
from scaler.runtime.text import plural
from scaler.store import Append, Conflict, EventStore

log = logging.getLogger("scaler.controller")

OFFSET_READS = 4  # lease entries a load reads this node's clock offset off

OWNERS = "owners"  # the queue group of cmd.<partition>: one node answers each command, even mid-hand-over
LOAD_ERROR_EVERY_S = 600.0
DRAIN_S = 15.0  # how long a partition given up waits for its commands under way
RELOAD_DRAIN_S = 1.0  # ... and one reloaded after a loss


OnMsg = Callable[[Msg], Awaitable[None]]


class NotServing(Unavailable):
    """This node does not (or no longer) serve the command's partition: another node, or soon."""


class Partitions:
    def __init__(
        self,
        nc: Client,
        events: EventStore,
        ledger: Ledger,
        store: SnapshotStore,
        snapshotter: Snapshotter,
        serving: set[int],
        on_command: Callable[[Msg], Awaitable[None]],
        on_report: Callable[[Msg], Awaitable[None]],
        served: Callable[[list[int]], Awaitable[None]],
        released: Callable[[dict[int, int], list[int]], Awaitable[None]],
        node: str,
        limits: Limits = NO_LIMITS,
        lease_ttl_s: float = TTL_S,
        lease_every_s: float = EVERY_S,
        replicas: int = 1,
        drain_s: float = DRAIN_S,
        reclaim: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.nc = nc
        self.events = events
        self.ledger = ledger
        self.store = store
        self.snapshotter = snapshotter
        self.serving = serving  # partitions loaded and answered here
        self.on_command = on_command  # a command on cmd.<partition>
        self.on_report = on_report  # a worker's report on report.<partition>
        self.served = served  # partitions just loaded and served: their timers and callers
        self.released = released  # (held, all) given up, their commands done: snapshot those held, forget them all
        self.limits = limits  # the operator's caps; those over all functions are split by partitions held
        self.drain_s = drain_s
        self.leases = Leases(events.nc, node, self.gained, self.lost, lease_ttl_s, lease_every_s, replicas, reclaim)
        self.clock = clock or Clock()
        self.clocks = Clocks(node)  # the writers' clocks, as the batches a load reads say
        self.clock_offset_ms: int | None = None  # this node's clock less the NATS server's, at the last load
        self.loaded_batches = 0  # batches read when partitions were gained, for the ready line
        self.loading: dict[int, asyncio.Task] = {}
        self.refused: dict[int, str] = {}  # partitions held but not loadable: why, as their commands are told
        self._releasing: dict[int, set[asyncio.Event]] = {}  # partitions given up whose release is under way
        self._load_error_at = -LOAD_ERROR_EVERY_S  # when a failed load was last logged
        self._subs: dict[int, list] = {}  # each partition's subscriptions: its commands, its reports
        self._in_flight: Counter[int] = Counter()  # commands under way, by partition
        self._drained = asyncio.Event()  # set when a partition's commands under way reach none
        self._opened = asyncio.Event()  # set (then replaced) when a partition may be decided here again
        self.leases.refreshed = self._open
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Take partitions; returns once the first ones are served (a broken stream stops the start)."""
        await self.leases.start()
        if self.loading:
            await asyncio.gather(*set(self.loading.values()))

    def serves(self, key: str) -> bool:
        return partition(key) in self.serving

    def check(self, p: int) -> None:
        """Refuse to decide for a partition not served here, or whose lease is past its renewal deadline."""
        if p not in self.serving:
            raise NotServing(f"partition {p} is not served by {self.leases.node}")
        if not self.leases.fresh(p):
            raise NotServing(f"partition {p}: {self.leases.node}'s lease is not renewed in time, it decides nothing")

    def decides(self, p: int) -> bool:
        """Whether this node may decide for partition `p` now: served here, its lease renewed in time."""
        return p in self.serving and self.leases.fresh(p)

    async def reopened(self, p: int, timeout_s: float) -> None:
        """Wait `timeout_s`, ended early once partition `p`, which this node cannot decide for now (NATS away, its
        lease lapsed or late, a load under way), may be decided here again."""
        if self.decides(p):
            await asyncio.sleep(timeout_s)
            return
        try:
            async with asyncio.timeout(timeout_s):
                while not self.decides(p):
                    await self._opened.wait()
        except TimeoutError:
            pass

    def _open(self) -> None:
        """A partition was served, or a late lease renewed: whoever waits for one looks again."""
        self._opened.set()
        self._opened = asyncio.Event()

    def entered(self, p: int) -> None:
        """A command of partition `p` is under way (a partition given up waits for it)."""
        self._in_flight[p] += 1

    def left(self, p: int) -> None:
        self._in_flight[p] -= 1
        if not self._in_flight[p]:
            self._drained.set()

    def keys(self, partitions: list[int]) -> list[str]:
        wanted = set(partitions)
        return [k for k in self.ledger.states if partition(k) in wanted]

    async def gained(self, partitions: list[int]) -> None:
        """Leased: load them in the background (the lease round must go on renewing meanwhile)."""
        self._load(partitions)

    def _load(self, partitions: list[int], behind: asyncio.Task | None = None) -> None:
        """One load for all of them (a load of many reads the stream once), once `behind` (a load cancelled) ends."""
        task = asyncio.create_task(self.load(partitions, behind))
        task.add_done_callback(_seen)
        for p in partitions:
            self.loading[p] = task

    async def reload(self, partitions: list[int], between: Callable[[], Awaitable[None]]) -> None:
        """Drop what is held of them without a snapshot (it is not to be trusted), run `between`, load them again.
        The commands under way get a moment to finish: their store is the one found wanting."""
        await self.lost(partitions, keep=False, drain_s=RELOAD_DRAIN_S)
        await between()
        await self.gained(partitions)
        await asyncio.gather(*{self.loading[p] for p in partitions if p in self.loading}, return_exceptions=True)

    async def load(self, partitions: list[int], behind: asyncio.Task | None = None) -> None:
        """Each partition's snapshot, then its batches after it; then serve it.

        Once what was held of them before is released: the lease round may take a partition again while the
        drop of its lapsed lease still waits for commands under way, and the release then forgets its functions.
        And once `behind`, a load of theirs cancelled when others of its partitions were given up, has ended.
        """
        asked = partitions  # those refused are dropped from `partitions` below, but were loaded here all the same
        try:
            if behind is not None:
                await asyncio.wait([behind])
            if releases := {e for p in partitions for e in self._releasing.get(p, ())}:
                await asyncio.gather(*(e.wait() for e in releases))
            at = await self.events.kept()
            snaps, uncovered = await rebuild.usable(self.store, at, partitions)
            if uncovered is not None:
                await self._refuse(uncovered)
                if not (partitions := list(snaps)):
                    return
            after = rebuild.restore(self.ledger, snaps)
            self.loaded_batches += await rebuild.fold_after(
                self.events, after, self.ledger.fold, None, None, self.clocks.heard
            )
            await self._rebase(partitions)
            for p in partitions:
                self.snapshotter.loaded(p, after[p], at.last_seq)
                await self._take(p, self.on_command, self.on_report)
                self.serving.add(p)
            self._open()
            self._share_the_caps()
            await self.served(partitions)
        except Exception as e:
            # The lease round takes them again each second: a lasting fault is said once, then every 10 minutes.
            if (now := time.monotonic()) - self._load_error_at >= LOAD_ERROR_EVERY_S:
                self._load_error_at = now
                log.error("could not load partitions %s; giving them back: %s", partitions, e)
            else:
                log.debug("could not load partitions %s; giving them back: %s", partitions, e)
            self._spawn(self._give_back(partitions))
            raise
        finally:
            for p in asked:
                if self.loading.get(p) is asyncio.current_task():  # not the load that took over a cancelled one's
                    del self.loading[p]

    async def _rebase(self, partitions: list[int]) -> None:
        """Move the times of functions another node wrote on another clock onto this node's (clocks.py), each
        with a ClockRebased batch stored before the partitions serve."""
        keys = self.keys(partitions)
        now, own = self.clock.now_ms(), None
        if self.clock.speed == 1 and (held := [p for p in partitions if p in self.leases.held][:OFFSET_READS]):
            own = await self._own_offset(held, now)
            self.clock_offset_ms = own if own is not None else self.clock_offset_ms
            await self.clocks.look_up(self.events.js, self.ledger, keys)
            if own is not None and abs(own) > clocks.SKEW_TOLERANCE_MS:
                log.warning("%s", clocks.own_said(self.leases.node, own))
        shifts = {k: shift for k in keys if (shift := self.clocks.shift(k, clocks.newest(self.ledger, k), own, now))}
        self.clocks.forget(keys)
        if not shifts:
            return
        await asyncio.gather(*(self._rebased(k, shift, now) for k, shift in shifts.items()))
        log.warning("%s %s", self.leases.node, clocks.said(ranges(sorted(partitions)), shifts))

    async def _rebased(self, key: str, shift: int, now: int) -> None:
        """Store the function's ClockRebased after its last batch. The stream holding a later one than the load read
        (a writer that lost the partition, its append landing late) is no reason to give the partition up: that
        batch is folded, and the rebase stored after it."""
        for _ in range(3):
            b = clocks.rebase_batch(self.ledger, key, shift, now)
            after = self.ledger.last_seq.get(key, 0)
            try:
                self.ledger.fold(await self.events.append(Append(*stored_as(b), after)), b)
                return
            except Conflict:
                await self.catch_up(key, "its rebase")
        raise Unavailable(f"{key}: its rebase conflicted three times in a row")

    async def catch_up(self, key: str, what: str) -> None:
        """Fold what the stream holds of `key` past the ledger, found when `what` conflicted at load. A batch at or
        below the watermark of the snapshot the load started from is one the snapshot claimed and lacked: said
        as the bug it is, with the batches."""
        held, folded = self.ledger.last_seq.get(key, 0), []

        def fold(seq: int, batch) -> None:
            folded.append((seq, batch.cause))
            self.ledger.fold(seq, batch)

        await self.events.read(fold, function_events(key), held)
        claimed = self.snapshotter.claimed(partition(key))
        lacked = [f"seq {seq} ({cause})" for seq, cause in folded if seq <= claimed]
        if lacked:
            log.error("%s: the snapshot of partition %d claims every batch up to seq %d, but lacked %s: folded now",
                      key, partition(key), claimed, ", ".join(lacked))  # fmt: skip
        else:
            log.warning("%s: %s found %s stored after the load read the stream: folded", key, what,
                        plural(len(folded), "batch", "batches"))  # fmt: skip

    async def _own_offset(self, partitions: list[int], now: int) -> int | None:
        """This node's offset from the server's clock, off its lease entries of `partitions`: the largest, as the
        time a write takes to be stored only makes one look further behind (and one that took long says nothing)."""
        reads = []
        for p in partitions:
            sent = clocks.ms_at(now, self.leases.renewed.get(p, time.monotonic()))
            took = round(self.leases.took.get(p, 0.0) * 1000)
            reads.append(clocks.own_offset(self.events.js, LEASES, self.leases.held[p], sent, took))
        offsets = [o for o in await asyncio.gather(*reads) if o is not None]
        return max(offsets, default=None)

    async def _refuse(self, uncovered: rebuild.Uncovered) -> None:
        log.error("%s refuses partitions %s: %s", self.leases.node, ranges(uncovered.partitions), uncovered)
        for p in uncovered.partitions:
            self.refused[p] = f"{self.leases.node} refuses partition {p}: {uncovered}"
            await self._take(p, self._answer_refused, self._answer_refused)

    async def _take(self, p: int, commands: OnMsg, reports: OnMsg) -> None:
        """Take the partition's commands and its workers' reports (one node of the queue group answers each), each
        kept as it is made, so a load cancelled between the two leaves nothing taken that is not given up with the
        partition; what a load cancelled after taking them took is given up first."""
        for sub in self._subs.pop(p, ()):
            await sub.unsubscribe()
        subs = self._subs[p] = []
        for subject, cb in ((CMD, commands), (REPORT, reports)):
            subs.append(await self.nc.subscribe(f"{subject}.{p}", queue=OWNERS, cb=cb))

    async def _answer_refused(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            cmd = decode_command(msg.data)
        except Exception:
            return  # the node's own subscriptions say what is unreadable; this one only refuses
        why = self.refused.get(partition(cmd.key), "partition refused")
        calls = isinstance(cmd, Assign | Idle) or isinstance(cmd, OPERATOR)
        code = Code.FAILED_PRECONDITION if calls else Code.UNAVAILABLE
        reply = Reply(to=msg.reply, request_id=getattr(cmd, "request_id", ""), code=code, message=why)
        await self.nc.publish(msg.reply, encode(reply))

    async def lost(self, partitions: list[int], keep: bool = True, drain_s: float | None = None) -> None:
        """Stop serving them: no new command, the ones under way finish, then the node releases them.

        Only a partition that was served is snapshotted (and only with `keep`): one still loading (or
        that failed to) holds no state a snapshot could claim. And only within the holding of its lease it was
        served in, taken as the release begins: one whose lease lapsed (dropped) is not this node's to snapshot,
        and the lease round may take it again while its commands under way finish; the snapshot written then in
        the new holding's name would claim the stream's newest batches with the state from before the lapse.
        """
        tenure = self.leases.tenure
        held = {p: tenure[p] for p in partitions if p in self.serving and p in tenure}
        released = asyncio.Event()
        for p in partitions:
            self._releasing.setdefault(p, set()).add(released)
        try:
            await self._release(partitions, held if keep else {}, self.drain_s if drain_s is None else drain_s)
        finally:
            for p in partitions:
                if (waiting := self._releasing.get(p)) is not None:
                    waiting.discard(released)
                    if not waiting:
                        del self._releasing[p]
            released.set()

    async def _release(self, partitions: list[int], held: dict[int, int], drain_s: float) -> None:
        cancelled = {task for p in partitions if (task := self.loading.pop(p, None)) is not None}
        for task in cancelled:
            task.cancel()
            # A load is one for all the partitions gained together: those of them still held are loaded again (a
            # node that took every partition while it seemed alone gives half back a round later, and the half it
            # kept was never loaded, its leases renewed, its commands answered by nobody).
            if kept := [p for p, loading in self.loading.items() if loading is task]:
                self.serving.difference_update(kept)  # any it served already: nothing decided on a state reloading
                self._load(kept, behind=task)
        for p in partitions:
            self.serving.discard(p)
            self.refused.pop(p, None)
            for sub in self._subs.pop(p, ()):
                await sub.unsubscribe()
        self._share_the_caps()
        try:
            async with asyncio.timeout(drain_s):
                while any(self._in_flight[p] for p in partitions):
                    self._drained.clear()
                    await self._drained.wait()
        except TimeoutError:  # NATS away: their appends fail on their own, and their snapshot is just older
            log.warning("partitions %s given up with commands still under way", partitions)
        await self.released(held, partitions)

    async def stop(self) -> None:
        await self.leases.stop()  # gives every partition back, each released first
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)

    async def _give_back(self, partitions: list[int]) -> None:
        await self.leases.give_back(partitions)

    def _share_the_caps(self) -> None:
        """Caps over all functions, split by partitions held: together the nodes never pass them."""
        self.ledger.limits = (
            self.limits.share(len(self.serving) / PARTITIONS) if self.limits is not NO_LIMITS else NO_LIMITS
        )

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _seen(task: asyncio.Task) -> None:
    """A failed load said why in its own log line; only a start awaits its task, so mark its exception seen (or
    asyncio logs it again, with its traceback, as never retrieved)."""
    if not task.cancelled():
        task.exception()


def stored_as(batch) -> tuple[str, bytes, str]:
    """A batch's subject, bytes and the subjects its order check spans."""
    return event_subject(batch.key, batch.effects), encode_batch(batch), function_events(batch.key)
