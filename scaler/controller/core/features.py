"""What a function's events say about it, for policies and people: its own fold, beside the lifecycle's.

Owned by the policy layer. Each function's features (`FnStats`) are kept in their own map beside its
lifecycle state (`state.FnState`, which knows nothing of them): `fold` takes the features, the event
and the lifecycle before and after `state.apply` folded it, and returns the new features. The features
are history (counters, recent gaps, lulls and runs, histograms, the score's figures), so nothing in
the lifecycle depends on them; the core hands them to the policies beside the state.

`VERSION` stamps what this fold computes, for snapshots (scaler/controller/snapshots.py, which keeps
them in a body of their own): a snapshot taken under another version holds other features, so it is
not used. A new feature bumps this version only, never the lifecycle's (`state.VERSION`). Tidying this module keeps
the version; changing what it computes must bump it, and `tests/controller/core/test_features.py` fails until
it does (it pins the features of a reference event log).
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from scaler.controller.core.next_gap import GAP_BINS
from scaler.proto.events import (
    Assigned,
    ClockRebased,
    Cued,
    Event,
    Followed,
    FunctionDeleted,
    FunctionForgotten,
    InstanceReady,
    InstanceRetired,
    KeptAlive,
    Lead,
    Released,
    RequestArrived,
    RequestFailed,
    SlotWanted,
)

if TYPE_CHECKING:  # the lifecycle is read, never imported at run time: state.py and this module stand apart
    from scaler.controller.core.state import FnState, Instance

VERSION = 10

GAPS_KEPT = 64  # recent inter-arrival times a policy can learn from
RUNS_KEPT = 32  # recent execution times
LULLS_KEPT = 32  # recent gaps longer than two starts: when a burst's next one came
EARLY_GAPS = 3  # a function's first gaps, which tell how soon functions seen once or twice come back
IDLE_BINS = 240  # idle-time histogram: 1-minute bins over 4 hours ("Serverless in the Wild")
GAP_HALF_LIFE_MS = 30 * 60_000  # its counts halve every 30 minutes, so rare long gaps are remembered
UNKNOWN_START_MS = 1_000  # assumed CreateSlot + Init before the function's first instance is ready
# A start not reported within its function's expected start (its last one) plus this will not come: its report was
# lost (with a store's lost tail, say) or nobody is left to send it. The margin covers what may rightly delay one:
# the platform worker holding a start while its circuit is open (up to 10 s), a dead worker's event coming back
# to another (its ack wait, 10 s), and the platform's own retries.
START_MARGIN_MS = 30_000
QUEUED_KEPT = 32  # recent requests' time queued for an instance
ACTIVITY_BIN_MS = 10_000  # the bins of a function's activity: a call in a bin makes it active
QUIET_KEPT = 32  # recent runs of quiet bins
FOLLOW_MS = 1_000  # a function back within this of another's return may be one that other calls
LEADERS_KEPT = 4  # the functions a function may follow
LEAD_LAGS_KEPT = 8  # recent lags from a leader's return to the function's
LEAD_TRIALS = 5  # a lead that failed most of this many trials is not followed
STARTS_KEPT = 16  # recent starts (SlotWanted to ready), as the core saw them
LATE_KEPT = 16  # recent keep-alive deadlines, how late they were acted on
OVERHEADS_KEPT = 32  # recent requests' hold of their instance beyond their run


class Leader(msgspec.Struct, frozen=True, kw_only=True):
    """A function this one may follow (it calls this one, say): it came back from a lull shortly before."""

    key: str
    lags: tuple[int, ...] = ()  # in recent trials that hit, how long after its return this function's call came
    trials: int = 0  # times it came back while this function had no instance, judged (by the next call, or cue)
    hits: int = 0  # ... and this function was called within FOLLOW_MS

    def failed(self) -> bool:
        return self.trials >= LEAD_TRIALS and 2 * self.hits < self.trials

    def share(self) -> float:
        """How likely this function is called within FOLLOW_MS of the leader's return: its trials' hits,
        with one hit and one miss assumed (Laplace), so that a lead tried twice is not taken as certain."""
        return (self.hits + 1) / (self.trials + 2)


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
    # Recent requests' time queued for an instance that existed when they came (0: served at once, or by an
    # instance started for them), one per request served, oldest first.
    queued: tuple[int, ...] = ()
    quiet_bins: tuple[int, ...] = ()  # recent runs of ACTIVITY_BIN_MS bins without a call between two with calls
    start_ms: int = 0  # the last instance's start: SlotWanted to ready (CreateSlot + Init + our overhead)
    lulls: tuple[int, ...] = ()  # recent gaps longer than two starts (long enough to retire and start again)
    early_gaps: tuple[int, ...] = ()  # the function's first EARLY_GAPS gaps
    gap_hist: tuple[float, ...] = ()  # inter-arrival times, decayed counts per half-octave (gap_bin)
    idle_hist: tuple[int, ...] = ()  # idle times (nothing in flight until the next arrival), by minute
    idle_oob: int = 0  # idle times beyond the histogram's 4 hours
    returned_ms: int = 0  # when the function last came back from a lull (or first came)
    leaders: tuple[Leader, ...] = ()  # functions it came back shortly after (Followed), and how reliably
    # Leaders that came back while the function had no instance (Cued), and when, until its next call.
    cues: tuple[tuple[str, int], ...] = ()
    # What the challenge's score is made of, summed over the function's life (see state.Totals).
    exec_ms: float = 0.0  # time instances were busy with requests
    exec_gb_ms: float = 0.0
    wait_ms: float = 0.0  # time requests waited for an instance
    ideal_gb_ms: float = 0.0  # idle slot time a clairvoyant scaler would pay (see _clairvoyant)
    ideal_free: tuple[int, ...] = ()  # when that scaler's instances free up, ascending (those it may still reuse)
    # The system it runs on, as its events measure it (what a live node's own work adds, and none offline
    # unless a latency model plays it): recent starts, from SlotWanted to ready as the core saw them (the
    # platform's CreateSlot and Init, and the node's dispatch and report of them); how late recent keep-alive
    # deadlines were acted on (the node's timers); and how much longer than its run each recent request held
    # its instance (the Assign's answer on its way out, the Idle's on its way in).
    starts: tuple[int, ...] = ()
    late: tuple[int, ...] = ()
    overheads: tuple[int, ...] = ()


NO_STATS = FnStats()


def gap_bin(gap_ms: int) -> int:
    return min(GAP_BINS - 1, max(0, int(2 * math.log2(max(gap_ms, 1)))))


Features = dict[str, FnStats]  # every function's features, by metaKey


def fold(st: FnStats, e: Event, before: FnState, after: FnState) -> FnStats:
    """The function's features once `e` is folded: `before` and `after` are its lifecycle around `e`."""
    match e:
        case RequestArrived(at_ms=t):
            return _arrival(st, t, before)
        case SlotWanted(for_request=r):
            return replace(st, cold_starts=st.cold_starts + 1) if r else replace(st, prewarms=st.prewarms + 1)
        case InstanceReady(instance_id=i, at_ms=t) if i in before.instances:
            start = t - before.instances[i].wanted_ms
            return replace(st, start_ms=start, starts=_ring(st.starts, start, STARTS_KEPT))
        case Assigned(request_id=r, instance_id=i, at_ms=t) if i in before.instances:
            return _assigned(st, t, r, before.instances[i], before)
        case Released(instance_id=i, at_ms=t, need_destroy=dies, duration_ms=ran) if i in before.instances:
            return _release(st, t, before.instances[i], dies, after, ran)
        case RequestFailed():
            return replace(st, failures=st.failures + 1)
        case Followed(leads=leads):
            return replace(st, leaders=_followed(st.leaders, leads))
        case Cued(leader=leader, at_ms=t):
            missed = {leader: None} if any(c[0] == leader for c in st.cues) else {}  # cued again: the last one failed
            leaders = _judged(st.leaders, missed)
            return replace(st, leaders=leaders, cues=(*(c for c in st.cues if c[0] != leader), (leader, t)))
        case FunctionForgotten() | FunctionDeleted():
            return NO_STATS
        case ClockRebased(shift_ms=shift):
            return shifted(st, shift)
        case InstanceRetired(instance_id=i, at_ms=t) | KeptAlive(instance_id=i, at_ms=t):
            return _expired(_unfinished(st, before, i, t), before, i, t)
    return st


def _assigned(st: FnStats, t: int, r: str, inst: Instance, before: FnState) -> FnStats:
    """Request `r` got `inst` at `t`: how long it waited, and of that how long it queued for an instance that
    existed when it came."""
    waiting = before.pending(r)
    if waiting is None:
        return st
    wait = t - waiting.since_ms
    queued = wait if inst.for_request != r and inst.wanted_ms <= waiting.since_ms else 0
    return replace(st, wait_ms=st.wait_ms + wait, queued=_ring(st.queued, queued, QUEUED_KEPT))


def start_bound_ms(st: FnStats) -> int:
    """How long an instance may be being created before its start is taken as lost (see START_MARGIN_MS)."""
    return (st.start_ms or UNKNOWN_START_MS) + START_MARGIN_MS


def _unfinished(st: FnStats, before: FnState, i: str, t: int) -> FnStats:
    """A start given up at `t` as lost, at its bound: its function's starts take at least that long. So the next
    start's bound and pre-warm lead grow with it, where a function whose Init takes longer than the bound would
    have every start given up, for ever. A start that failed before its bound says nothing of how long one takes."""
    inst = before.instances.get(i)
    if inst is None or inst.phase != "creating":
        return st
    took = t - inst.wanted_ms
    if took < start_bound_ms(st):
        return st
    return replace(st, start_ms=took)


def _expired(st: FnStats, before: FnState, i: str, t: int) -> FnStats:
    """An idle instance retired or kept longer at `t`: when its keep-alive deadline had come, this is its timer's
    doing, as late as it is."""
    inst = before.instances.get(i)
    if inst is None or inst.phase != "idle" or not 0 < inst.keep_until_ms <= t:
        return st
    return replace(st, late=_ring(st.late, t - inst.keep_until_ms, LATE_KEPT))


def shifted(st: FnStats, shift_ms: int) -> FnStats:
    """The stats with every time they hold moved by `shift_ms` (ClockRebased); durations stay as they are."""
    if st is NO_STATS:
        return st

    def at(t: int) -> int:
        return t + shift_ms if t else 0

    return replace(
        st,
        last_arrival_ms=at(st.last_arrival_ms),
        last_end_ms=at(st.last_end_ms),
        returned_ms=at(st.returned_ms),
        cues=tuple((leader, at(t)) for leader, t in st.cues),
        ideal_free=tuple(at(t) for t in st.ideal_free),
    )


def comes_back(st: FnStats, t: int) -> bool:
    """Whether an arrival at `t` ends a lull (a gap long enough to retire an instance and start one again),
    or is the function's first."""
    return not st.arrivals or t - st.last_arrival_ms > 2 * (st.start_ms or UNKNOWN_START_MS)


def _followed(leaders: tuple[Leader, ...], leads: tuple[Lead, ...]) -> tuple[Leader, ...]:
    """The leaders with these leads: a new one joins while fewer than LEADERS_KEPT are kept, or in a failed
    one's place. (A lag seen here may be any return of the function, one in the middle of its calls too; a
    trial's is the one a pre-warm is for: the first call after a return of the leader that found it with no
    instance.)"""
    out = list(leaders)
    for lead in leads:
        if any(x.key == lead.key for x in out):
            continue
        new = Leader(key=lead.key)
        if len(out) < LEADERS_KEPT:
            out.append(new)
        elif (failed := next((n for n, x in enumerate(out) if x.failed()), None)) is not None:
            out[failed] = new
    return tuple(out)


def _judged(leaders: tuple[Leader, ...], outcomes: dict[str, int | None]) -> tuple[Leader, ...]:
    """The leaders, with the trials of `outcomes` judged: a leader's lag when the function came within FOLLOW_MS
    of its return (a hit), None when not."""
    if not outcomes:
        return leaders
    return tuple(x if x.key not in outcomes else _trial(x, outcomes[x.key]) for x in leaders)


def _trial(x: Leader, lag: int | None) -> Leader:
    if lag is None:
        return replace(x, trials=x.trials + 1)
    return replace(x, trials=x.trials + 1, hits=x.hits + 1, lags=_ring(x.lags, lag, LEAD_LAGS_KEPT))


def _outcomes(st: FnStats, t: int) -> dict[str, int | None]:
    """What an arrival at `t` says of the trials the function's cues began: a hit within FOLLOW_MS, else a miss."""
    return {leader: (t - at if t - at <= FOLLOW_MS else None) for leader, at in st.cues}


def _release(st: FnStats, t: int, inst: Instance, dies: bool, after: FnState, ran: int) -> FnStats:
    """A request let its instance go: a run ends (when it was busy), and maybe the function's activity. `ran`:
    how long the platform says it ran (0: not said)."""
    last_end = st.last_end_ms if after.in_flight() else t
    if not inst.busy:
        return replace(st, last_end_ms=last_end, deaths=st.deaths + dies)
    busy = t - inst.since_ms
    return replace(
        st,
        exec_ms=st.exec_ms + busy,
        exec_gb_ms=st.exec_gb_ms + busy * inst.memory_mb / 1024,
        runs=_ring(st.runs, busy, RUNS_KEPT),
        last_end_ms=last_end,
        deaths=st.deaths + dies,
        overheads=_ring(st.overheads, max(0, busy - ran), OVERHEADS_KEPT) if ran > 0 else st.overheads,
    )


def _arrival(st: FnStats, t: int, before: FnState) -> FnStats:
    gaps, gap_hist = _gaps(st, t)
    lulls = _lulls(st, t)
    idle_hist, idle_oob = _idle_time(st, t, before)
    ideal_ms, ideal_free = _clairvoyant(st, t)
    return replace(
        st,
        ideal_gb_ms=st.ideal_gb_ms + ideal_ms * (before.meta.memory_mb / 1024 if before.meta else 1.0),
        ideal_free=ideal_free,
        arrivals=st.arrivals + 1,
        last_arrival_ms=t,
        gaps=gaps,
        lulls=lulls,
        quiet_bins=_quiet_bins(st, t),
        early_gaps=(*st.early_gaps, t - st.last_arrival_ms) if 0 < st.arrivals <= EARLY_GAPS else st.early_gaps,
        gap_hist=gap_hist,
        idle_hist=idle_hist,
        idle_oob=idle_oob,
        returned_ms=t if comes_back(st, t) else st.returned_ms,
        leaders=_judged(st.leaders, _outcomes(st, t)),
        cues=(),
    )


def _lulls(st: FnStats, t: int) -> tuple[int, ...]:
    """The recent lulls, with the gap that ends now if it was one: long enough to retire an instance and
    start one again. Kept apart from the gaps, whose ring a busy function fills with short ones in seconds."""
    if not st.arrivals or not comes_back(st, t):
        return st.lulls
    return _ring(st.lulls, t - st.last_arrival_ms, LULLS_KEPT)


def _quiet_bins(st: FnStats, t: int) -> tuple[int, ...]:
    """The recent runs of quiet bins, with the one that ends now when this call is the first of its bin."""
    this, last = t // ACTIVITY_BIN_MS, st.last_arrival_ms // ACTIVITY_BIN_MS
    if not st.arrivals or this <= last:
        return st.quiet_bins
    return _ring(st.quiet_bins, this - last - 1, QUIET_KEPT)


def _gaps(st: FnStats, t: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The recent gaps and the decayed gap histogram, with the gap that ends now."""
    if not st.arrivals:
        return st.gaps, st.gap_hist
    gap = t - st.last_arrival_ms
    decay = 0.5 ** (gap / GAP_HALF_LIFE_MS)
    hist = list(map(decay.__mul__, st.gap_hist)) if st.gap_hist else [0.0] * GAP_BINS
    hist[gap_bin(gap)] += 1.0
    return _ring(st.gaps, gap, GAPS_KEPT), tuple(hist)


def _idle_time(st: FnStats, t: int, before: FnState) -> tuple[tuple[int, ...], int]:
    """The idle-time histogram, with the idle time that ends now when the function had nothing in flight."""
    if not st.last_end_ms or before.in_flight():
        return st.idle_hist, st.idle_oob
    minute = (t - st.last_end_ms) // 60_000
    if minute >= IDLE_BINS:
        return st.idle_hist, st.idle_oob + 1
    hist = list(st.idle_hist) if st.idle_hist else [0] * IDLE_BINS
    hist[minute] += 1
    return tuple(hist), st.idle_oob


def _clairvoyant(st: FnStats, t: int) -> tuple[float, tuple[int, ...]]:
    """The idle slot time a clairvoyant scaler pays for this arrival, and when its instances free up after it.

    It serves the arrival on the instance that freed most recently, paying the time it stood idle,
    or on one started just in time, paying a start; an instance idle longer than a start is not worth
    keeping (it retires, and starting another costs the same). Each request is taken to run the
    recent mean. From the arrivals and runs alone, so it does not depend on our own choices.
    """
    start = st.start_ms or UNKNOWN_START_MS
    run = round(sum(st.runs) / len(st.runs)) if st.runs else 0
    free = [f for f in st.ideal_free if f > t - start]
    taken = bisect.bisect_right(free, t)
    if taken:
        idle = float(t - free.pop(taken - 1))
    else:
        idle = float(start)
    bisect.insort(free, t + run)
    return idle, tuple(free)


def _ring(values: tuple[int, ...], value: int, keep: int) -> tuple[int, ...]:
    return (*values[1 - keep :], value) if len(values) >= keep else (*values, value)
