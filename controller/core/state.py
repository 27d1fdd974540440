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


GAPS_KEPT = 64  # recent inter-arrival times a policy can learn from
RUNS_KEPT = 32  # recent execution times
IDLE_BINS = 240  # idle-time histogram: 1-minute bins over 4 hours ("Serverless in the Wild")
GAP_BINS = 48  # inter-arrival histogram: half-octave bins from 1 ms to 4.6 h
GAP_HALF_LIFE_MS = 30 * 60_000  # its counts halve every 30 minutes, so rare long gaps are remembered
PEAK_HALF_LIFE_MS = 5 * 60_000  # the remembered peak load halves every 5 minutes
SHORT_GAPS = 8  # arrivals that make the short-term rate


def gap_bin(gap_ms: int) -> int:
    return min(GAP_BINS - 1, max(0, int(2 * math.log2(max(gap_ms, 1)))))


class FnStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the function's events say about it; counters for people, history for policies."""

    arrivals: int = 0
    cold_starts: int = 0  # instances started for a waiting request
    prewarms: int = 0  # instances started with no request waiting
    failures: int = 0  # requests answered with an error
    last_arrival_ms: int = 0
    last_end_ms: int = 0  # when the function last had no request left in flight
    gaps: tuple[int, ...] = ()  # recent inter-arrival times, oldest first
    last_idle_ms: int = 0  # when an instance last became idle with nobody waiting (0: an arrival came since)
    idle_gaps: tuple[int, ...] = ()  # recent times from an instance going idle to the next arrival
    runs: tuple[int, ...] = ()  # recent execution times (assignment to release)
    start_ms: int = 0  # the last instance's start: SlotWanted to ready (CreateSlot + Init + our overhead)
    gap_hist: tuple[float, ...] = ()  # inter-arrival times, decayed counts per half-octave (gap_bin)
    peak_load: float = 0.0  # highest recent offered load (short-term rate x mean run), decaying
    peak_at_ms: int = 0
    idle_hist: tuple[int, ...] = ()  # idle times (nothing in flight until the next arrival), by minute
    idle_oob: int = 0  # idle times beyond the histogram's 4 hours


def _ring(values: tuple[int, ...], value: int, keep: int) -> tuple[int, ...]:
    return (*values[1 - keep :], value) if len(values) >= keep else (*values, value)


class FnState(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    meta: Meta | None = None
    instances: dict[str, Instance] = {}
    queue: tuple[Pending, ...] = ()
    started: int = 0  # instances ever wanted: numbers the next instance id
    stats: FnStats = FnStats()

    def in_phase(self, phase: Phase) -> list[Instance]:
        return [i for i in self.instances.values() if i.phase is phase]

    def pending(self, request_id: str) -> Pending | None:
        return next((p for p in self.queue if p.request_id == request_id), None)

    def next_instance_id(self) -> str:
        return f"{self.key}-{self.started + 1}"


def _put(s: FnState, inst: Instance) -> FnState:
    return replace(s, instances={**s.instances, inst.id: inst})


def _drop(s: FnState, instance_id: str) -> FnState:
    instances = dict(s.instances)
    instances.pop(instance_id, None)
    return replace(s, instances=instances)


def _dequeue(s: FnState, request_id: str) -> FnState:
    return replace(s, queue=tuple(p for p in s.queue if p.request_id != request_id))


def _waiters(s: FnState, request_id: str, change) -> FnState:
    return replace(
        s, queue=tuple(replace(p, waiters=change(p.waiters)) if p.request_id == request_id else p for p in s.queue)
    )


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
            s = replace(_put(s, inst), started=s.started + 1)
            return _bump(s, cold_starts=1) if r else _bump(s, prewarms=1)
        case InstanceReady(instance_id=i, slot_id=slot, init_ms=init, at_ms=t) if i in s.instances:
            old = s.instances[i]
            inst = replace(old, phase=Phase.IDLE, since_ms=t, slot_id=slot, init_ms=init, for_request="")
            return replace(_put(s, inst), stats=replace(s.stats, start_ms=t - old.wanted_ms))
        case Assigned(request_id=r, instance_id=i, at_ms=t) if i in s.instances:
            waiting = s.pending(r)
            waiters = waiting.waiters if waiting else ()
            inst = replace(s.instances[i], phase=Phase.BUSY, since_ms=t, request_id=r, waiters=waiters, keep_until_ms=0)
            return _put(_dequeue(s, r), inst)
        case Released(instance_id=i, at_ms=t) if i in s.instances:
            old = s.instances[i]
            s = _put(s, replace(old, phase=Phase.IDLE, since_ms=t, keep_until_ms=0))
            st = s.stats
            runs = _ring(st.runs, t - old.since_ms, RUNS_KEPT) if old.phase is Phase.BUSY else st.runs
            last_end = t if not s.queue and not s.in_phase(Phase.BUSY) else st.last_end_ms
            last_idle = st.last_idle_ms if s.queue else t  # with a queue it is reassigned at once
            return replace(s, stats=replace(st, runs=runs, last_end_ms=last_end, last_idle_ms=last_idle))
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
                return _drop(s, i)
            if old is None:  # a slot we never knew: track it until destroyed
                old = Instance(id=i, phase=Phase.RETIRING, since_ms=t, memory_mb=0)
            return _put(s, replace(old, phase=Phase.RETIRING, since_ms=t, slot_id=slot))
        case InstanceDestroyed(instance_id=i):
            return _drop(s, i)
        case Waiting():
            return s  # explains a decision; changes nothing
        case InstanceReady() | Assigned() | Released() | KeptAlive():
            return s  # about an instance already gone: nothing to change
    raise TypeError(f"no state change defined for {type(e).__name__}")


def _arrival(s: FnState, t: int) -> FnStats:
    st = s.stats
    gaps, gap_hist = st.gaps, st.gap_hist
    if st.arrivals:
        gap = t - st.last_arrival_ms
        gaps = _ring(gaps, gap, GAPS_KEPT)
        decay = 0.5 ** (gap / GAP_HALF_LIFE_MS)
        gap_hist = tuple(c * decay for c in gap_hist) if gap_hist else (0.0,) * GAP_BINS
        b = gap_bin(gap)
        gap_hist = (*gap_hist[:b], gap_hist[b] + 1.0, *gap_hist[b + 1 :])
    idle_gaps = _ring(st.idle_gaps, t - st.last_idle_ms, GAPS_KEPT) if st.last_idle_ms else st.idle_gaps
    peak, peak_at = st.peak_load, st.peak_at_ms
    recent = gaps[-SHORT_GAPS:]
    if st.runs and recent:
        # Offered load now: the short-term arrival rate x the mean run, but never more than the
        # arrivals that really overlap within one run (a burst of long runs is not a storm).
        run = sum(st.runs) / len(st.runs)
        overlapping, back = 1, 0
        for g in reversed(gaps):
            back += g
            if back > run:
                break
            overlapping += 1
        load = min(len(recent) / max(sum(recent), 1) * run, overlapping)
        peak = max(peak * 0.5 ** ((t - peak_at) / PEAK_HALF_LIFE_MS), load)
        peak_at = t
    hist, oob = st.idle_hist, st.idle_oob
    if st.last_end_ms and not s.queue and not s.in_phase(Phase.BUSY):  # the function was idle until now
        minute = (t - st.last_end_ms) // 60_000
        if minute < IDLE_BINS:
            hist = hist or (0,) * IDLE_BINS
            hist = (*hist[:minute], hist[minute] + 1, *hist[minute + 1 :])
        else:
            oob += 1
    return replace(
        st,
        arrivals=st.arrivals + 1,
        last_arrival_ms=t,
        gaps=gaps,
        gap_hist=gap_hist,
        peak_load=peak,
        peak_at_ms=peak_at,
        last_idle_ms=0,
        idle_gaps=idle_gaps,
        idle_hist=hist,
        idle_oob=oob,
    )


def replay(s: FnState, events: Iterable[Event]) -> FnState:
    return functools.reduce(apply, events, s)
