"""Per-function state, rebuilt only by folding events: `replay(FnState(key), events)`."""

import enum
import functools
import math
from collections.abc import Iterable

import msgspec
from msgspec.structs import replace

from proto.events import (
    Assigned,
    Event,
    FunctionSeen,
    InstanceDestroyed,
    InstanceReady,
    InstanceRetired,
    KeptAlive,
    Meta,
    Released,
    RequestArrived,
    RequestCancelled,
    RequestFailed,
    RequestRetried,
    SlotWanted,
    WaiterLeft,
    Waiting,
)


class Phase(enum.StrEnum):
    CREATING = "creating"  # CreateSlot + Init under way
    IDLE = "idle"
    BUSY = "busy"
    RETIRING = "retiring"  # serves no more; its slot is being destroyed


class Instance(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    phase: Phase
    since_ms: int  # when it entered its phase
    memory_mb: int
    slot_id: str = ""
    request_id: str = ""  # the request it serves when busy, else the last one it served
    waiters: tuple[str, ...] = ()  # where that request's answer went: who may cancel it
    keep_until_ms: int = 0  # when idle: the policy's keep-alive deadline; 0 until decided
    wanted_ms: int = 0
    for_request: str = ""  # when creating: the request whose miss started it
    init_ms: int = 0


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """An Assign waiting for an instance."""

    request_id: str
    waiters: tuple[str, ...]  # reply subjects of its callers (a retried call adds one)
    since_ms: int


FINISHED_KEPT = 256  # recent releases remembered, so a repeated Idle or Assign is known for what it is
GAPS_KEPT = 64  # recent inter-arrival times a policy can learn from
RUNS_KEPT = 32  # recent execution times
BURSTS_KEPT = 32  # recent burst-to-burst periods
IDLE_BINS = 240  # idle-time histogram: 1-minute bins over 4 hours ("Serverless in the Wild")
GAP_BINS = 48  # inter-arrival histogram: half-octave bins from 1 ms to 4.6 h
GAP_HALF_LIFE_MS = 30 * 60_000  # its counts halve every 30 minutes, so rare long gaps are remembered
UNKNOWN_START_MS = 1_000  # assumed CreateSlot + Init before the function's first instance is ready


def gap_bin(gap_ms: int) -> int:
    return min(GAP_BINS - 1, max(0, int(2 * math.log2(max(gap_ms, 1)))))


class FnStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the function's events say about it; counters for people, history for policies."""

    arrivals: int = 0
    cold_starts: int = 0  # instances started for a waiting request
    prewarms: int = 0  # instances started with no request waiting
    failures: int = 0  # requests answered with an error
    deaths: int = 0  # instances lost with their request (need_destroy)
    last_arrival_ms: int = 0
    last_end_ms: int = 0  # when the function last had no request left in flight
    gaps: tuple[int, ...] = ()  # recent inter-arrival times, oldest first
    runs: tuple[int, ...] = ()  # recent execution times (assignment to release)
    start_ms: int = 0  # the last instance's start: SlotWanted to ready (CreateSlot + Init + our overhead)
    burst_start_ms: int = 0  # the arrival that began the current burst (after a gap > 2 starts)
    bursts: tuple[int, ...] = ()  # recent times from one burst's start to the next's
    gap_hist: tuple[float, ...] = ()  # inter-arrival times, decayed counts per half-octave (gap_bin)
    idle_hist: tuple[int, ...] = ()  # idle times (nothing in flight until the next arrival), by minute
    idle_oob: int = 0  # idle times beyond the histogram's 4 hours
    # What the challenge's score is made of, summed over the function's life (see Totals).
    exec_ms: float = 0.0  # time instances were busy with requests
    exec_gb_ms: float = 0.0
    wait_ms: float = 0.0  # time requests waited for an instance
    slot_gb_ms: float = 0.0  # memory x life of instances already gone
    live_gb: float = 0.0  # memory of instances not gone yet
    live_gb_since: float = 0.0  # sum of their memory x start time, so open slot time is now x live_gb - this
    ideal_gb_ms: float = 0.0  # idle slot time a clairvoyant scaler would pay: min(gap, start) x memory per arrival


def _ring(values: tuple[int, ...], value: int, keep: int) -> tuple[int, ...]:
    return (*values[1 - keep :], value) if len(values) >= keep else (*values, value)


class FnState(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    meta: Meta | None = None
    instances: dict[str, Instance] = {}
    queue: tuple[Pending, ...] = ()
    started: int = 0  # instances ever wanted: numbers the next instance id
    stats: FnStats = FnStats()
    finished: dict[str, str] = {}  # request -> instance of the latest releases, oldest first

    def in_phase(self, phase: Phase) -> list[Instance]:
        return [i for i in self.instances.values() if i.phase is phase]

    def pending(self, request_id: str) -> Pending | None:
        return next((p for p in self.queue if p.request_id == request_id), None)

    def next_instance_id(self) -> str:
        return f"{self.key}-{self.started + 1}"

    def finished_on(self, request_id: str) -> str | None:
        """The instance a recently finished request was released from, if it is one."""
        return self.finished.get(request_id)


def _put(s: FnState, inst: Instance) -> FnState:
    return replace(s, instances={**s.instances, inst.id: inst})


def _gone(s: FnState, instance_id: str, t: int) -> FnState:
    """The instance is gone: its slot time is closed (from when it was wanted until now)."""
    instances = dict(s.instances)
    inst = instances.pop(instance_id, None)
    if inst is None:
        return s
    st = s.stats
    if inst.wanted_ms:  # started by us (an orphan slot found later has no start of ours)
        gb = inst.memory_mb / 1024
        st = replace(
            st,
            slot_gb_ms=st.slot_gb_ms + gb * (t - inst.wanted_ms),
            live_gb=st.live_gb - gb,
            live_gb_since=st.live_gb_since - gb * inst.wanted_ms,
        )
    return replace(s, instances=instances, stats=st)


def _remember(finished: dict[str, str], request_id: str, instance_id: str) -> dict[str, str]:
    kept = dict(finished)
    kept.pop(request_id, None)  # a reused request id moves to the newest end
    kept[request_id] = instance_id
    if len(kept) > FINISHED_KEPT:
        del kept[next(iter(kept))]
    return kept


def _opened(st: FnStats, inst: Instance) -> FnStats:
    gb = inst.memory_mb / 1024
    return replace(st, live_gb=st.live_gb + gb, live_gb_since=st.live_gb_since + gb * inst.wanted_ms)


def _dequeue(s: FnState, request_id: str) -> FnState:
    return replace(s, queue=tuple(p for p in s.queue if p.request_id != request_id))


def _waiters(s: FnState, request_id: str, change) -> FnState:
    """Change who waits for a request's answer: while it is queued, or once an instance serves it."""
    queue = tuple(replace(p, waiters=change(p.waiters)) if p.request_id == request_id else p for p in s.queue)
    held = {
        i.id: replace(i, waiters=change(i.waiters))
        for i in s.instances.values()
        if i.phase is Phase.BUSY and i.request_id == request_id
    }
    return replace(s, queue=queue, instances={**s.instances, **held} if held else s.instances)


def _bump(s: FnState, **changes: int) -> FnState:
    stats = s.stats
    return replace(s, stats=replace(stats, **{k: getattr(stats, k) + v for k, v in changes.items()}))


def apply(s: FnState, e: Event) -> FnState:
    """The one way state changes. Tolerant of events about instances it no longer has."""
    match e:
        case FunctionSeen(meta=meta):
            return replace(s, meta=meta)
        case RequestArrived(request_id=r, reply_to=to, at_ms=t):
            waiting = Pending(request_id=r, waiters=(to,) if to else (), since_ms=t)
            return replace(s, queue=(*s.queue, waiting), stats=_arrival(s, t))
        case RequestRetried(request_id=r, reply_to=to):
            return _waiters(s, r, lambda w: (*w, to) if to not in w else w)
        case WaiterLeft(request_id=r, reply_to=to):
            return _waiters(s, r, lambda w: tuple(x for x in w if x != to))
        case SlotWanted(instance_id=i, meta=meta, for_request=r, at_ms=t):
            inst = Instance(
                id=i, phase=Phase.CREATING, since_ms=t, memory_mb=meta.memory_mb, wanted_ms=t, for_request=r
            )
            s = replace(_put(s, inst), started=s.started + 1, stats=_opened(s.stats, inst))
            return _bump(s, cold_starts=1) if r else _bump(s, prewarms=1)
        case InstanceReady(instance_id=i, slot_id=slot, init_ms=init, at_ms=t) if i in s.instances:
            old = s.instances[i]
            inst = replace(old, phase=Phase.IDLE, since_ms=t, slot_id=slot, init_ms=init, for_request="")
            return replace(_put(s, inst), stats=replace(s.stats, start_ms=t - old.wanted_ms))
        case Assigned(request_id=r, instance_id=i, at_ms=t) if i in s.instances:
            waiting = s.pending(r)
            waiters = waiting.waiters if waiting else ()
            if waiting is not None:
                s = replace(s, stats=replace(s.stats, wait_ms=s.stats.wait_ms + t - waiting.since_ms))
            inst = replace(s.instances[i], phase=Phase.BUSY, since_ms=t, request_id=r, waiters=waiters, keep_until_ms=0)
            return _put(_dequeue(s, r), inst)
        case Released(request_id=r, instance_id=i, at_ms=t, need_destroy=dies) if i in s.instances:
            old = s.instances[i]
            s = _put(s, replace(old, phase=Phase.IDLE, since_ms=t, keep_until_ms=0))
            s = replace(s, finished=_remember(s.finished, r, i))
            st = s.stats
            if old.phase is Phase.BUSY:
                busy = t - old.since_ms
                st = replace(st, exec_ms=st.exec_ms + busy, exec_gb_ms=st.exec_gb_ms + busy * old.memory_mb / 1024)
            runs = _ring(st.runs, t - old.since_ms, RUNS_KEPT) if old.phase is Phase.BUSY else st.runs
            last_end = t if not s.queue and not s.in_phase(Phase.BUSY) else st.last_end_ms
            st = replace(st, runs=runs, last_end_ms=last_end, deaths=st.deaths + dies)
            return replace(s, stats=st)
        case KeptAlive(instance_id=i, until_ms=until) if i in s.instances:
            return _put(s, replace(s.instances[i], keep_until_ms=until))
        case RequestFailed(request_id=r):
            return _bump(_dequeue(s, r), failures=1)
        case RequestCancelled(request_id=r):
            return _dequeue(s, r)
        case InstanceRetired(instance_id=i, slot_id=slot, at_ms=t):
            old = s.instances.get(i)
            slot = slot or (old.slot_id if old else "")
            if not slot:  # nothing on the platform to destroy
                return _gone(s, i, t)
            if old is None:  # a slot we never knew: track it until destroyed
                old = Instance(id=i, phase=Phase.RETIRING, since_ms=t, memory_mb=0)
            return _put(s, replace(old, phase=Phase.RETIRING, since_ms=t, slot_id=slot))
        case InstanceDestroyed(instance_id=i, at_ms=t):
            return _gone(s, i, t)
        case Waiting():
            return s  # explains a decision; changes nothing
        case InstanceReady() | Assigned() | Released() | KeptAlive():
            return s  # about an instance already gone: nothing to change
    raise TypeError(f"no state change defined for {type(e).__name__}")


def _arrival(s: FnState, t: int) -> FnStats:
    st = s.stats
    gaps, gap_hist = st.gaps, st.gap_hist
    burst_start, bursts = st.burst_start_ms, st.bursts
    # A burst begins after a gap long enough to retire an instance and start one again.
    if not st.arrivals or t - st.last_arrival_ms > 2 * (st.start_ms or UNKNOWN_START_MS):
        if burst_start:
            bursts = _ring(bursts, t - burst_start, BURSTS_KEPT)
        burst_start = t
    if st.arrivals:
        gap = t - st.last_arrival_ms
        gaps = _ring(gaps, gap, GAPS_KEPT)
        decay = 0.5 ** (gap / GAP_HALF_LIFE_MS)
        gap_hist = tuple(c * decay for c in gap_hist) if gap_hist else (0.0,) * GAP_BINS
        b = gap_bin(gap)
        gap_hist = (*gap_hist[:b], gap_hist[b] + 1.0, *gap_hist[b + 1 :])
    hist, oob = st.idle_hist, st.idle_oob
    if st.last_end_ms and not s.queue and not s.in_phase(Phase.BUSY):  # the function was idle until now
        minute = (t - st.last_end_ms) // 60_000
        if minute < IDLE_BINS:
            hist = hist or (0,) * IDLE_BINS
            hist = (*hist[:minute], hist[minute] + 1, *hist[minute + 1 :])
        else:
            oob += 1
    # A clairvoyant scaler keeps the instance that ran the previous request through the gap after it,
    # or starts one just in time: the arrival costs that idle time, at most one start (none when
    # the requests overlap). From the arrivals alone, so it does not depend on our own choices.
    gb = s.meta.memory_mb / 1024 if s.meta else 1.0
    start = st.start_ms or UNKNOWN_START_MS
    run = sum(st.runs) / len(st.runs) if st.runs else 0.0
    ideal = min(max(t - st.last_arrival_ms - run, 0.0), start) if st.arrivals else start
    return replace(
        st,
        ideal_gb_ms=st.ideal_gb_ms + ideal * gb,
        arrivals=st.arrivals + 1,
        last_arrival_ms=t,
        gaps=gaps,
        burst_start_ms=burst_start,
        bursts=bursts,
        gap_hist=gap_hist,
        idle_hist=hist,
        idle_oob=oob,
    )


class Totals(msgspec.Struct, kw_only=True):
    """The whole run so far, summed over functions: what the score is made of."""

    exec_ms: float = 0.0
    exec_gb_ms: float = 0.0
    wait_ms: float = 0.0
    slot_gb_ms: float = 0.0
    live_gb: float = 0.0
    live_gb_since: float = 0.0
    ideal_gb_ms: float = 0.0

    def add(self, st: FnStats, sign: int = 1) -> None:
        self.exec_ms += sign * st.exec_ms
        self.exec_gb_ms += sign * st.exec_gb_ms
        self.wait_ms += sign * st.wait_ms
        self.slot_gb_ms += sign * st.slot_gb_ms
        self.live_gb += sign * st.live_gb
        self.live_gb_since += sign * st.live_gb_since
        self.ideal_gb_ms += sign * st.ideal_gb_ms

    def change(self, old: FnState | None, new: FnState) -> None:
        """Account for one function's state replacing its previous one."""
        if old is not None:
            self.add(old.stats, -1)
        self.add(new.stats)

    def slot_gb_ms_at(self, now: int) -> float:
        return self.slot_gb_ms + now * self.live_gb - self.live_gb_since


def replay(s: FnState, events: Iterable[Event]) -> FnState:
    return functools.reduce(apply, events, s)
