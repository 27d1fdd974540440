"""Events and states in words, for a person debugging a cold start with `scaler replay`."""

import datetime
from collections.abc import Iterator
from typing import Any

import msgspec

from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.state import FnState, Instance, Override, Phase
from scaler.proto.events import (
    Assigned,
    Batch,
    ClockRebased,
    Cued,
    Event,
    Followed,
    FunctionCreated,
    FunctionDeleted,
    FunctionForgotten,
    FunctionRestarted,
    FunctionRested,
    FunctionSeen,
    InstanceCreated,
    InstanceDestroyed,
    InstanceReady,
    InstanceRetired,
    InstanceToRetire,
    KeptAlive,
    LimitsSet,
    PolicySet,
    Released,
    RequestArrived,
    RequestCancelled,
    RequestFailed,
    RequestRetried,
    RequestWaiting,
    SessionBound,
    SessionEnded,
    SlotWanted,
    StartsHeld,
    StateBound,
    StateDeleted,
    TenantSet,
    VersionSet,
    WaiterLeft,
)
from scaler.proto.subjects import SYSTEM_KEY


def clock(ms: int) -> str:
    """Time of day (UTC) to the millisecond: what a timeline shows."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]


def moment(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _why(text: str) -> str:
    return f" ({text})" if text else ""


def event(e: Event) -> str:
    match e:
        case FunctionSeen(meta=m):
            runtime = f" {m.runtime}" if m.runtime else ""
            return f"function seen: {m.memory_mb} MB{runtime}, timeout {m.timeout_s}s"
        case RequestArrived(request_id=r, session=session, state=state):
            if state:
                return f"request {r} of state {state} queued"
            return f"request {r} of session {session} queued" if session else f"request {r} queued"
        case RequestRetried(request_id=r):
            return f"request {r} asked again: one more caller waits"
        case WaiterLeft(request_id=r):
            return f"a caller of {r} gave up; others still wait"
        case RequestWaiting(request_id=r, expected_ms=t, why=why):
            return f"{r} waits for a busy instance" + (f", served about {clock(t)}" if t else "") + _why(why)
        case SlotWanted(instance_id=i, for_request=r, reason=why, version=v):
            at = f" at version {v}" if v else ""
            return f"start {i}{at} for {r}{_why(why)}" if r else f"pre-warm {i}{at}{_why(why)}"
        case InstanceCreated(instance_id=i, slot_id=slot, create_ms=c):
            return f"{i} has its slot {slot} (create {c} ms); Init next"
        case InstanceReady(instance_id=i, slot_id=slot, create_ms=c, init_ms=n):
            return f"{i} ready on {slot} (create {c} ms, init {n} ms)"
        case Assigned(request_id=r, instance_id=i):
            return f"{r} → {i}"
        case Released(request_id=r, instance_id=i, status_code=code, duration_ms=d, reason=why):
            return f"{r} done with {i} (status {code}, ran {d} ms){_why(why)}"
        case KeptAlive(instance_id=i, until_ms=until, why=why):
            return f"{i} kept alive until {clock(until)}{_why(why)}"
        case RequestFailed(request_id=r, message=m):
            return f"request {r} failed: {m}"
        case RequestCancelled(request_id=r, reason=why):
            return f"request {r} cancelled{_why(why)}"
        case InstanceRetired(instance_id=i, slot_id=slot, reason=why):
            return f"{i} retired{_why(why)}" + (f"; {slot} to destroy" if slot else "")
        case InstanceDestroyed(instance_id=i, slot_id=slot, reason=why):
            return f"{i} gone" + (f" with {slot}" if slot else "") + _why(why)
        case SessionBound(session=session, instance_id=i, request_id=r, why=why):
            return f"session {session} bound to {i} by {r}{_why(why)}"
        case SessionEnded(session=session, reason=why):
            return f"session {session} unbound{_why(why)}"
        case FunctionRestarted(reason=why):
            return f"function restarted by an operator{_why(why)}: busy instances retire when released"
        case FunctionDeleted(reason=why):
            return f"function deleted by an operator{_why(why)}: its state forgotten, its calls refused until created"
        case InstanceToRetire(instance_id=i, reason=why):
            return f"{i} retires once released{_why(why)}"
        case StateBound(state=state, instance_id=i, request_id=r, why=why):
            return f"state {state} bound to {i} by {r}{_why(why)}"
        case StateDeleted(state=state, reason=why):
            return f"state {state} deleted by an operator{_why(why)}"
        case LimitsSet(reason=why):
            given = Override.given(e).items()
            named = ", ".join(f"{k} {v:g}" for k, v in given if v is not None) or "as the limits file says"
            return f"limits set while running: {named}{_why(why)}"
        case PolicySet(policy=p, reason=why):
            return f"policy {p or 'of the node'} decides it from now on{_why(why)}"
        case VersionSet(version=v, reason=why):
            return f"version {v or '(none)'}: instances of another version retire as they become idle{_why(why)}"
        case TenantSet(tenant=t, reason=why):
            return f"tenant {t}: its instances count against the tenant's quotas{_why(why)}"
        case FunctionCreated(version=v, reason=why):
            at = f" at version {v}" if v else ""
            return f"function created again{at}: its calls are served{_why(why)}"
        case FunctionRested():
            return "function at rest: its record of recent releases dropped"
        case FunctionForgotten():
            return "function forgotten: idle too long; its next call starts afresh"
        case Followed(leads=leads):
            after = ", ".join(f"{lead.lag_ms} ms after {lead.key}" for lead in leads)
            return f"came back {after}: it may follow {'it' if len(leads) == 1 else 'them'}"
        case Cued(leader=leader):
            return f"{leader} came back while this function has no instance: a trial of following it"
        case StartsHeld(until_ms=until, reason=why):
            return f"no new start until {clock(until)}{_why(why)}"
        case ClockRebased(shift_ms=shift):
            return f"times moved {shift / 1000:+.1f} s onto the clock of the node that loaded it"
    fields = ", ".join(f"{k}={v!r}" for k, v in msgspec.structs.asdict(e).items() if k != "at_ms")
    return f"{type(e).__name__}({fields})"


def batch(seq: int, b: Batch) -> str:
    """One decision on one line: when, where in the stream, why, what."""
    line = f"{clock(b.at_ms)} seq {seq} {b.cause} → " + "; ".join(event(e) for e in b.events)
    if b.wake_ms is not None:
        line += f"; next deadline {clock(b.wake_ms)}"
    return line


def name(key: str) -> str:
    return "(slots of no known function)" if key == SYSTEM_KEY else key


def _instance(i: Instance) -> str:
    slot = i.slot_id or "no slot yet"
    match i.phase:
        case Phase.CREATING:
            what = f"for {i.for_request}" if i.for_request else "pre-warm"
            return f"{i.id:<14} creating  {what}, wanted at {clock(i.wanted_ms)}"
        case Phase.BUSY:
            restart = f", retires when released ({i.retire_on_release})" if i.retire_on_release else ""
            return f"{i.id:<14} busy      {slot}, held by {i.request_id} since {clock(i.since_ms)}{restart}"
        case Phase.IDLE:
            keep = f", keep-alive until {clock(i.keep_until_ms)}" if i.keep_until_ms else ""
            return f"{i.id:<14} idle      {slot}, since {clock(i.since_ms)}{keep}"
        case _:
            return f"{i.id:<14} {i.phase.value:<9} {slot}, since {clock(i.since_ms)}"


def state(s: FnState, st: FnStats = NO_STATS, last_seq: int = 0) -> Iterator[str]:
    """The function's state in words, with its features' counters (`st`)."""
    meta = f"  {s.meta.memory_mb} MB {s.meta.runtime}".rstrip() if s.meta else ""
    yield f"{name(s.key)}{meta}" + (f"  (last batch seq {last_seq})" if last_seq else "")
    counts = f"arrivals {st.arrivals}, cold starts {st.cold_starts}, pre-warms {st.prewarms}, failures {st.failures}"
    yield "  " + counts + (f", last arrival {clock(st.last_arrival_ms)}" if st.last_arrival_ms else "")
    for p in s.queue:
        yield f"  waiting: {p.request_id} since {clock(p.since_ms)} ({len(p.waiters)} caller(s))"
    for i in sorted(s.instances.values(), key=lambda i: (i.wanted_ms, i.id)):
        yield "  " + _instance(i)
    for session, b in sorted(s.sessions.items()):
        yield f"  session {session} → {b.instance_id}, last used {clock(b.used_ms)}"
    for name_, route in sorted(s.states.items()):
        gone = "" if route.instance_id in s.instances else " (gone: its next request binds it anew)"
        yield f"  state {name_} → {route.instance_id}{gone}, since {clock(route.bound_ms)}"
    if settings := _settings(s):
        yield "  " + settings
    if not s.instances and not s.queue:
        yield "  no instances"


def _settings(s: FnState) -> str:
    """What an operator (or the calls) set for the function, on one line ("" if nothing)."""
    said = [f"tenant {s.tenant}" if s.tenant else "", f"version {s.version}" if s.version else ""]
    said.append(f"policy {s.policy}" if s.policy else "")
    if s.limits is not None:
        given = msgspec.structs.asdict(s.limits)
        said.append("limits " + ", ".join(f"{k} {v}" for k, v in given.items() if v is not None))
    if s.deleted is not None:
        said.append(f"DELETED at {clock(s.deleted.at_ms)}{_why(s.deleted.reason)}: its calls are refused")
    return "; ".join(x for x in said if x)


def differences(replayed: Any, running: Any, path: str = "") -> Iterator[str]:
    """Where two states differ, as `path: replayed X, controller Y` lines."""
    a, b = msgspec.to_builtins(replayed), msgspec.to_builtins(running)
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            where = f"{path}.{k}" if path else str(k)
            if k not in a:
                yield f"{where}: only in the controller"
            elif k not in b:
                yield f"{where}: only in the replay"
            else:
                yield from differences(a[k], b[k], where)
    elif a != b:
        yield f"{path}: replayed {a!r}, controller {b!r}"
