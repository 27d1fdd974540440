"""Per-function state, rebuilt only by folding events: `replay(FnState(key), events)`."""

import enum
import functools
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


class FnStats(msgspec.Struct, frozen=True, kw_only=True):
    """Counters for people reading the state; policies learn from these too."""

    arrivals: int = 0
    cold_starts: int = 0  # instances started for a waiting request
    prewarms: int = 0  # instances started with no request waiting
    failures: int = 0  # requests answered with an error
    last_arrival_ms: int = 0


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
            s = replace(s, queue=(*s.queue, waiting))
            s = replace(s, stats=replace(s.stats, last_arrival_ms=t))
            return _bump(s, arrivals=1)
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
            inst = replace(s.instances[i], phase=Phase.IDLE, since_ms=t, slot_id=slot, init_ms=init, for_request="")
            return _put(s, inst)
        case Assigned(request_id=r, instance_id=i, at_ms=t) if i in s.instances:
            waiting = s.pending(r)
            waiters = waiting.waiters if waiting else ()
            inst = replace(s.instances[i], phase=Phase.BUSY, since_ms=t, request_id=r, waiters=waiters, keep_until_ms=0)
            return _put(_dequeue(s, r), inst)
        case Released(instance_id=i, at_ms=t) if i in s.instances:
            return _put(s, replace(s.instances[i], phase=Phase.IDLE, since_ms=t, keep_until_ms=0))
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
        case InstanceReady() | Assigned() | Released() | KeptAlive():
            return s  # about an instance already gone: nothing to change
    raise TypeError(f"no state change defined for {type(e).__name__}")


def replay(s: FnState, events: Iterable[Event]) -> FnState:
    return functools.reduce(apply, events, s)
