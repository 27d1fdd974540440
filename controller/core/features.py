"""What a function's events say about it, for policies and people: its own fold, beside the lifecycle's.

`state.apply` folds an event in two steps: the lifecycle (instances, queue) in `state.py`, then
`observe` here, which reads the state before and after the event and changes only `FnStats`.
The features are history (counters, recent gaps, lulls and runs, histograms, the score's
figures), so nothing in the lifecycle depends on them.

`VERSION` stamps what this fold computes, for snapshots (controller/snapshots.py): a snapshot
taken under another version holds other features, so it is not used. Tidying this module keeps
the version; changing what it computes must bump it, and `tests/test_features.py` fails until
it does (it pins the features of a reference event log).
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from proto.events import (
    Assigned,
    Event,
    FunctionDeleted,
    FunctionForgotten,
    InstanceReady,
    Released,
    RequestArrived,
    RequestFailed,
    SlotWanted,
)

if TYPE_CHECKING:
    from controller.core.state import FnState, Instance

VERSION = 3

GAPS_KEPT = 64  # recent inter-arrival times a policy can learn from
RUNS_KEPT = 32  # recent execution times
LULLS_KEPT = 32  # recent gaps longer than two starts: when a burst's next one came
EARLY_GAPS = 3  # a function's first gaps, which tell how soon functions seen once or twice come back
IDLE_BINS = 240  # idle-time histogram: 1-minute bins over 4 hours ("Serverless in the Wild")
GAP_BINS = 48  # inter-arrival histogram: half-octave bins from 1 ms to 4.6 h
GAP_HALF_LIFE_MS = 30 * 60_000  # its counts halve every 30 minutes, so rare long gaps are remembered
UNKNOWN_START_MS = 1_000  # assumed CreateSlot + Init before the function's first instance is ready
QUEUED_KEPT = 32  # recent requests' time queued for an instance
ACTIVITY_BIN_MS = 10_000  # the bins of a function's activity: a call in a bin makes it active
QUIET_KEPT = 32  # recent runs of quiet bins


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
    # What the challenge's score is made of, summed over the function's life (see state.Totals).
    exec_ms: float = 0.0  # time instances were busy with requests
    exec_gb_ms: float = 0.0
    wait_ms: float = 0.0  # time requests waited for an instance
    ideal_gb_ms: float = 0.0  # idle slot time a clairvoyant scaler would pay (see _clairvoyant)
    ideal_free: tuple[int, ...] = ()  # when that scaler's instances free up, ascending (those it may still reuse)


NO_STATS = FnStats()


def gap_bin(gap_ms: int) -> int:
    return min(GAP_BINS - 1, max(0, int(2 * math.log2(max(gap_ms, 1)))))


def observe(st: FnStats, e: Event, before: FnState, after: FnState) -> FnStats:
    """The function's stats once `e` is folded: `before` and `after` are its lifecycle around `e`."""
    match e:
        case RequestArrived(at_ms=t):
            return _arrival(st, t, before)
        case SlotWanted(for_request=r):
            return replace(st, cold_starts=st.cold_starts + 1) if r else replace(st, prewarms=st.prewarms + 1)
        case InstanceReady(instance_id=i, at_ms=t) if i in before.instances:
            return replace(st, start_ms=t - before.instances[i].wanted_ms)
        case Assigned(request_id=r, instance_id=i, at_ms=t) if i in before.instances:
            waiting = before.pending(r)
            if waiting is None:
                return st
            wait = t - waiting.since_ms
            inst = before.instances[i]
            queued = wait if inst.for_request != r and inst.wanted_ms <= waiting.since_ms else 0
            return replace(st, wait_ms=st.wait_ms + wait, queued=_ring(st.queued, queued, QUEUED_KEPT))
        case Released(instance_id=i, at_ms=t, need_destroy=dies) if i in before.instances:
            return _release(st, t, before.instances[i], dies, after)
        case RequestFailed():
            return replace(st, failures=st.failures + 1)
        case FunctionForgotten() | FunctionDeleted():
            return NO_STATS
    return st


def _release(st: FnStats, t: int, inst: Instance, dies: bool, after: FnState) -> FnStats:
    """A request let its instance go: a run ends (when it was busy), and maybe the function's activity."""
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
    )


def _arrival(st: FnStats, t: int, before: FnState) -> FnStats:
    gaps, gap_hist = _gaps(st, t)
    idle_hist, idle_oob = _idle_time(st, t, before)
    ideal_ms, ideal_free = _clairvoyant(st, t)
    return replace(
        st,
        ideal_gb_ms=st.ideal_gb_ms + ideal_ms * (before.meta.memory_mb / 1024 if before.meta else 1.0),
        ideal_free=ideal_free,
        arrivals=st.arrivals + 1,
        last_arrival_ms=t,
        gaps=gaps,
        lulls=_lulls(st, t),
        quiet_bins=_quiet_bins(st, t),
        early_gaps=(*st.early_gaps, t - st.last_arrival_ms) if 0 < st.arrivals <= EARLY_GAPS else st.early_gaps,
        gap_hist=gap_hist,
        idle_hist=idle_hist,
        idle_oob=idle_oob,
    )


def _lulls(st: FnStats, t: int) -> tuple[int, ...]:
    """The recent lulls, with the gap that ends now if it was one: long enough to retire an instance and
    start one again. Kept apart from the gaps, whose ring a busy function fills with short ones in seconds."""
    gap = t - st.last_arrival_ms
    if not st.arrivals or gap <= 2 * (st.start_ms or UNKNOWN_START_MS):
        return st.lulls
    return _ring(st.lulls, gap, LULLS_KEPT)


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
    hist = tuple(c * decay for c in st.gap_hist) if st.gap_hist else (0.0,) * GAP_BINS
    b = gap_bin(gap)
    return _ring(st.gaps, gap, GAPS_KEPT), (*hist[:b], hist[b] + 1.0, *hist[b + 1 :])


def _idle_time(st: FnStats, t: int, before: FnState) -> tuple[tuple[int, ...], int]:
    """The idle-time histogram, with the idle time that ends now when the function had nothing in flight."""
    if not st.last_end_ms or before.in_flight():
        return st.idle_hist, st.idle_oob
    minute = (t - st.last_end_ms) // 60_000
    if minute >= IDLE_BINS:
        return st.idle_hist, st.idle_oob + 1
    hist = st.idle_hist or (0,) * IDLE_BINS
    return (*hist[:minute], hist[minute] + 1, *hist[minute + 1 :]), st.idle_oob


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
