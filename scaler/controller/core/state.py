"""Per-function state, rebuilt only by folding events: `replay(FnState(key), events)`.

`apply` folds one event into the lifecycle: the function's meta, its instances and their phases, its
queue of waiting requests. What the events say of the function's history (its features, `FnStats`)
is another fold, owned by the policy layer and kept beside this one (scaler/controller/core/features.py):
it reads the lifecycle and never changes it, and this module knows nothing of it.

`VERSION` stamps what this fold computes and the shape it stores, for snapshots
(scaler/controller/snapshots.py): a change to either bumps it, with an upcast from the version before
(scaler/controller/upcasts.py), so that every snapshot an earlier version wrote still loads.
"""

import enum
import functools
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from msgspec.structs import replace

from scaler.proto.events import (
    Assigned,
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
    Meta,
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
    runtime: str = ""  # the function's runtime and version when it was wanted: another one retires it when idle
    version: str = ""
    slot_id: str = ""
    request_id: str = ""  # the request it serves when busy, else the last one it served
    waiters: tuple[str, ...] = ()  # where that request's answer went: who may cancel it
    keep_until_ms: int = 0  # when idle: the policy's keep-alive deadline; 0 until decided
    wanted_ms: int = 0
    for_request: str = ""  # the request whose miss started it ("": started ahead of demand, a pre-warm)
    session: str = ""  # when busy: the session of the request it serves
    retire_on_release: str = ""  # why it retires once released (an operator restarted or stopped it while busy)
    reserved: bool = False  # started to keep the function's reserved instances (min_warm), not on demand
    served: int = 0  # requests it ran to their Idle
    errors: int = 0  # ... of which answered with a status code of 400 or more
    busy_ms: int = 0  # time it spent running them

    @property
    def busy(self) -> bool:
        return self.phase is Phase.BUSY

    def serves(self, request_id: str) -> bool:
        """Whether it is busy with that request (an idle one keeps the id of the last request it served)."""
        return self.phase is Phase.BUSY and self.request_id == request_id


class Pending(msgspec.Struct, frozen=True, kw_only=True):
    """An Assign waiting for an instance."""

    request_id: str
    waiters: tuple[str, ...]  # reply subjects of its callers (a retried call adds one)
    since_ms: int
    session: str = ""
    state: str = ""


class Binding(msgspec.Struct, frozen=True, kw_only=True):
    """A session's instance, and when the session last used it (its last request assigned or released)."""

    instance_id: str
    used_ms: int


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """A state's instance (stateful routes): bound until the state is deleted, moved when the instance goes."""

    instance_id: str
    bound_ms: int


class Override(msgspec.Struct, frozen=True, kw_only=True):
    """Limits an operator set while the function runs, over the limits file's (None: as the file says)."""

    max_instances: int | None = None
    max_memory_mb: int | None = None
    min_warm: int | None = None
    exchange_rate: float | None = None

    @staticmethod
    def given(x: Any) -> dict[str, float | None]:
        """These limits as `x` names them (a Configure, a LimitsSet, an admin call, an Override): one list of them."""
        return {name: getattr(x, name) for name in Override.__struct_fields__}


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    """A deleted function: its Assigns are refused until it is created again (or called at another version)."""

    at_ms: int
    reason: str = ""
    version: str = ""  # the version it had: an Assign naming another one creates it again


# 1: `finished` held only the instance, at most 256, forgotten at rest (stamped by a hash); 2: no sessions;
# 3: no queueing times or quiet bins in the stats; 4: `finished` one map, not generations of them; 5: no
# leaders in the stats; 6: no tenants, states, versions, tombstones, live limits or policy; an instance
# had no runtime, version or counts, and `restarting` for `retire_on_release`; 7: no hold of starts;
# 8: no next gap's points in the stats; 9: no ClockRebased (its times were never moved); 10: the features
# (`stats`) inside the state; 11: no exchange rate in the limits an operator set; 12: no slot time for an
# instance wanted at time 0
VERSION = 13

# Releases are remembered for as long as the platform may retry their Assign or Idle (the function's lease
# window: its timeout plus the grace), so a late retry is known for what it is; at most FINISHED_KEPT of them.
# They are kept in generations of FINISHED_GENERATION, oldest first: a release copies only the newest
# generation (the state is a value: one map of 2,048 copied on every release took 6 % of a node's time on
# one busy function), and what the window or the bound lets go goes a whole generation at a time.
FINISHED_KEPT = 2048
FINISHED_GENERATION = 128
LEASE_GRACE_MS = 30_000  # how long past its function's timeout a request may hold an instance
# The timeout of a function whose Assigns give none (timeout_in_secs 0), so that every busy instance
# has a lease: 15 minutes, the longest a serverless function commonly may run (AWS Lambda's limit).
DEFAULT_TIMEOUT_S = 900


class Finished(msgspec.Struct, frozen=True, array_like=True):
    """A released request: the instance that served it, and when."""

    instance_id: str
    at_ms: int


class FnState(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    meta: Meta | None = None
    instances: dict[str, Instance] = {}
    queue: tuple[Pending, ...] = ()
    started: int = 0  # instances ever wanted: numbers the next instance id
    finished: tuple[dict[str, Finished], ...] = ()  # the releases within the lease window, by request, in generations
    slot_gb_ms: float = 0.0  # memory x life (from wanted to gone) of the instances already gone
    rested: bool = False  # nothing in flight since it rested (FunctionRested): only forgetting is left
    sessions: dict[str, Binding] = {}  # session -> the instance its requests prefer
    states: dict[str, Route] = {}  # state -> the instance that holds it (stateful routes)
    # What an operator (or the caller's metadata) set: kept when the function is forgotten.
    tenant: str = ""  # whose quotas its instances count against
    version: str = ""
    policy: str = ""  # the policy that decides it ("": the node's, or the limits file's)
    limits: Override | None = None  # over the limits file's
    deleted: Tombstone | None = None  # deleted: its Assigns are refused until it is created again

    starts_held_until_ms: int = 0  # no new start before this: the platform worker's circuit is open (StartsHeld)
    starts_held_why: str = ""  # the worker's word for it

    def configured(self) -> bool:
        """Whether it holds what an operator set, which outlives its instances (and its being forgotten)."""
        return bool(self.tenant or self.version or self.policy or self.limits is not None or self.deleted is not None)

    def holder(self, instance_id: str) -> str:
        """The state an instance holds ("" if none)."""
        if self.states:
            for state, route in self.states.items():
                if route.instance_id == instance_id:
                    return state
        return ""

    def in_phase(self, phase: Phase) -> list[Instance]:
        return [i for i in self.instances.values() if i.phase is phase]

    def nothing_live(self) -> bool:
        """No request waiting and no instance but retiring ones: its next call would find nothing (what a
        pre-warm, or a cue, is for)."""
        return not self.queue and all(i.phase is Phase.RETIRING for i in self.instances.values())

    def in_flight(self) -> bool:
        """Whether any request is waiting or being served."""
        return bool(self.queue) or any(i.phase is Phase.BUSY for i in self.instances.values())

    def pending(self, request_id: str) -> Pending | None:
        return next((p for p in self.queue if p.request_id == request_id), None)

    def next_instance_id(self) -> str:
        return f"{self.key}-{self.started + 1}"

    def slot_gb_ms_at(self, now: int) -> float:
        """Memory x life of every instance started for the function, those alive counted until `now`."""
        alive = sum(i.memory_mb / 1024 * (now - i.wanted_ms) for i in self.instances.values())
        return self.slot_gb_ms + alive

    def release_of(self, request_id: str) -> Finished | None:
        """The request's release, if it is still kept."""
        for generation in self.finished:
            if (done := generation.get(request_id)) is not None:
                return done
        return None

    def last_release(self) -> Finished | None:
        return next(reversed(self.finished[-1].values())) if self.finished else None

    def finished_on(self, request_id: str, now: int) -> str | None:
        """The instance a request was released from, if that was within its lease window before `now`."""
        done = self.release_of(request_id)
        return done.instance_id if done is not None and done.at_ms >= now - self.lease_ms() else None

    def timeout_s(self) -> int:
        return self.meta.timeout_s if self.meta is not None and self.meta.timeout_s > 0 else DEFAULT_TIMEOUT_S

    def lease_ms(self) -> int:
        """How long a request may hold an instance, and may be retried: the function's timeout and a grace."""
        return self.timeout_s() * 1000 + LEASE_GRACE_MS


def apply(s: FnState, e: Event) -> FnState:
    """The one way state changes. Tolerant of events about instances it no longer has."""
    step = _LIFECYCLE.get(type(e))
    if step is None:
        raise TypeError(f"no state change defined for {type(e).__name__}")
    return step(s, e)


def replay(s: FnState, events: Iterable[Event]) -> FnState:
    return functools.reduce(apply, events, s)


# --- the lifecycle: one step per event ------------------------------------------------------


def _function_seen(s: FnState, e: FunctionSeen) -> FnState:
    return replace(s, meta=e.meta, deleted=None)  # seen again after a delete (before tombstones): it is back


def _request_arrived(s: FnState, e: RequestArrived) -> FnState:
    waiters = (e.reply_to,) if e.reply_to else ()
    waiting = Pending(request_id=e.request_id, waiters=waiters, since_ms=e.at_ms, session=e.session, state=e.state)
    return replace(s, queue=(*s.queue, waiting), rested=False)


def _function_rested(s: FnState, e: FunctionRested) -> FnState:
    return replace(s, finished=_recent(s, s.finished, e.at_ms), rested=True)


def _function_forgotten(s: FnState, e: FunctionForgotten) -> FnState:
    return _configuration(s)  # what holds nothing is dropped (scaler/controller/ledger.py)


def _configuration(s: FnState, **kept: Any) -> FnState:
    """A fresh state of the function that keeps only what an operator set (and `kept`)."""
    return FnState(
        key=s.key, tenant=s.tenant, version=s.version, policy=s.policy, limits=s.limits, deleted=s.deleted, **kept
    )


def _request_retried(s: FnState, e: RequestRetried) -> FnState:
    return _waiters(s, e.request_id, lambda w: (*w, e.reply_to) if e.reply_to not in w else w)


def _waiter_left(s: FnState, e: WaiterLeft) -> FnState:
    return _waiters(s, e.request_id, lambda w: tuple(x for x in w if x != e.reply_to))


def _slot_wanted(s: FnState, e: SlotWanted) -> FnState:
    inst = Instance(
        id=e.instance_id,
        phase=Phase.CREATING,
        since_ms=e.at_ms,
        memory_mb=e.meta.memory_mb,
        runtime=e.meta.runtime,
        version=e.version,
        wanted_ms=e.at_ms,
        for_request=e.for_request,
        reserved=e.reserved,
    )
    return replace(_put(s, inst), started=s.started + 1)


def _instance_created(s: FnState, e: InstanceCreated) -> FnState:
    old = s.instances.get(e.instance_id)
    if old is None:
        return s
    return _put(s, replace(old, slot_id=e.slot_id))


def _instance_ready(s: FnState, e: InstanceReady) -> FnState:
    old = s.instances.get(e.instance_id)
    if old is None:
        return s  # about an instance already gone
    return _put(s, replace(old, phase=Phase.IDLE, since_ms=e.at_ms, slot_id=e.slot_id))


def _assigned(s: FnState, e: Assigned) -> FnState:
    old = s.instances.get(e.instance_id)
    if old is None:
        return s
    waiting = s.pending(e.request_id)
    waiters, session = (waiting.waiters, waiting.session) if waiting else ((), "")
    inst = replace(
        old,
        phase=Phase.BUSY,
        since_ms=e.at_ms,
        request_id=e.request_id,
        waiters=waiters,
        keep_until_ms=0,
        session=session,
    )
    return _used(_put(_dequeue(s, e.request_id), inst), session, inst.id, e.at_ms)


def _used(s: FnState, session: str, instance_id: str, at_ms: int) -> FnState:
    """The session used its bound instance at `at_ms`: its idle time starts again."""
    bound = s.sessions.get(session) if session else None
    if bound is None or bound.instance_id != instance_id:
        return s
    return replace(s, sessions={**s.sessions, session: replace(bound, used_ms=at_ms)})


def _released(s: FnState, e: Released) -> FnState:
    old = s.instances.get(e.instance_id)
    if old is None:
        return s
    idle = dict(phase=Phase.IDLE, since_ms=e.at_ms, keep_until_ms=0, session="")
    s = _put(s, replace(old, **idle) if e.cancelled or old.phase is not Phase.BUSY else _counted(old, e, idle))
    s = _used(s, old.session, old.id, e.at_ms)
    if e.cancelled:  # never served: a retry of the request is served anew
        return s if s.release_of(e.request_id) is None else replace(s, finished=_forget(s.finished, e.request_id))
    return replace(s, finished=_remember(s, e.request_id, Finished(e.instance_id, e.at_ms)))


def _counted(inst: Instance, e: Released, idle: dict[str, Any]) -> Instance:
    """The instance idle once it ran a request to its release, and that request counted."""
    failed = e.status_code >= 400 or e.status_code == 0
    busy = max(0, e.at_ms - inst.since_ms)
    return replace(inst, served=inst.served + 1, errors=inst.errors + failed, busy_ms=inst.busy_ms + busy, **idle)


Generations = tuple[dict[str, Finished], ...]


def _forget(finished: Generations, request_id: str) -> Generations:
    """The generations without the request's release (those it leaves empty gone)."""
    kept = ({r: d for r, d in g.items() if r != request_id} if request_id in g else g for g in finished)
    return tuple(g for g in kept if g)


def _remember(s: FnState, request_id: str, done: Finished) -> Generations:
    kept = _recent(s, s.finished, done.at_ms)
    if s.release_of(request_id) is not None:  # a reused request id moves to the newest end
        kept = _forget(kept, request_id)
    if kept and len(kept[-1]) < FINISHED_GENERATION:
        kept = (*kept[:-1], {**kept[-1], request_id: done})
    else:
        kept = (*kept, {request_id: done})
    while sum(len(g) for g in kept) > FINISHED_KEPT:
        kept = kept[1:]
    return kept


def _recent(s: FnState, finished: Generations, now: int) -> Generations:
    """The generations that hold a release a retry may still come for at `now` (the same tuple when all do).
    A generation goes once its newest release is past the window; until then lookups skip the older ones."""
    since = now - s.lease_ms()
    gone = 0
    while gone < len(finished) and next(reversed(finished[gone].values())).at_ms < since:
        gone += 1
    return finished[gone:] if gone else finished


def _kept_alive(s: FnState, e: KeptAlive) -> FnState:
    old = s.instances.get(e.instance_id)
    if old is None:
        return s
    return _put(s, replace(old, keep_until_ms=e.until_ms))


def _request_ended(s: FnState, e: RequestFailed | RequestCancelled) -> FnState:
    return _dequeue(s, e.request_id)


def _instance_retired(s: FnState, e: InstanceRetired) -> FnState:
    old = s.instances.get(e.instance_id)
    slot = e.slot_id or (old.slot_id if old else "")
    if not slot:  # nothing on the platform to destroy
        return _gone(s, e.instance_id, e.at_ms)
    if old is None:  # a slot we never knew: track it until destroyed
        old = Instance(id=e.instance_id, phase=Phase.RETIRING, since_ms=e.at_ms, memory_mb=0)
    return _put(s, replace(old, phase=Phase.RETIRING, since_ms=e.at_ms, slot_id=slot))


def _instance_destroyed(s: FnState, e: InstanceDestroyed) -> FnState:
    return _gone(s, e.instance_id, e.at_ms)


def _session_bound(s: FnState, e: SessionBound) -> FnState:
    return replace(s, sessions={**s.sessions, e.session: Binding(instance_id=e.instance_id, used_ms=e.at_ms)})


def _session_ended(s: FnState, e: SessionEnded) -> FnState:
    return replace(s, sessions={k: b for k, b in s.sessions.items() if k != e.session})


def _function_restarted(s: FnState, e: FunctionRestarted) -> FnState:
    why = f"restarted: {e.reason}" if e.reason else "restarted"
    busy = {i.id: replace(i, retire_on_release=why) for i in s.instances.values() if i.phase is Phase.BUSY}
    return replace(s, instances={**s.instances, **busy}) if busy else s


def _instance_to_retire(s: FnState, e: InstanceToRetire) -> FnState:
    old = s.instances.get(e.instance_id)
    return _put(s, replace(old, retire_on_release=e.reason or "stopped")) if old is not None else s


def _function_deleted(s: FnState, e: FunctionDeleted) -> FnState:
    """Only the slots still being destroyed are kept, and the instance count with them (no id is used twice
    while they remain), and a tombstone: what an operator had set goes with the rest."""
    retiring = {i.id: i for i in s.instances.values() if i.phase is Phase.RETIRING}
    tombstone = Tombstone(at_ms=e.at_ms, reason=e.reason, version=s.version)
    return FnState(key=s.key, instances=retiring, started=s.started, slot_gb_ms=s.slot_gb_ms, deleted=tombstone)


def _function_created(s: FnState, e: FunctionCreated) -> FnState:
    return replace(s, deleted=None, version=e.version or s.version)


def _state_bound(s: FnState, e: StateBound) -> FnState:
    return replace(s, states={**s.states, e.state: Route(instance_id=e.instance_id, bound_ms=e.at_ms)})


def _state_deleted(s: FnState, e: StateDeleted) -> FnState:
    return replace(s, states={k: r for k, r in s.states.items() if k != e.state})


def _limits_set(s: FnState, e: LimitsSet) -> FnState:
    given = Override(**Override.given(e))
    return replace(s, limits=None if given == Override() else given)


def _policy_set(s: FnState, e: PolicySet) -> FnState:
    return replace(s, policy=e.policy)


def _version_set(s: FnState, e: VersionSet) -> FnState:
    return replace(s, version=e.version)


def _tenant_set(s: FnState, e: TenantSet) -> FnState:
    return replace(s, tenant=e.tenant)


def _starts_held(s: FnState, e: StartsHeld) -> FnState:
    return replace(s, starts_held_until_ms=e.until_ms, starts_held_why=e.reason)


def _clock_rebased(s: FnState, e: ClockRebased) -> FnState:
    """Every time the state holds, moved by `e.shift_ms` onto the clock of the node that loaded it (its features
    are moved by `features.shifted`, in their own fold); what is not a time (a duration, a count) stays."""
    shift = e.shift_ms

    def at(t: int) -> int:
        return t + shift if t else 0

    def moved(i: Instance) -> Instance:
        return replace(i, since_ms=at(i.since_ms), keep_until_ms=at(i.keep_until_ms), wanted_ms=at(i.wanted_ms))

    return replace(
        s,
        instances={k: moved(i) for k, i in s.instances.items()},
        queue=tuple(replace(p, since_ms=at(p.since_ms)) for p in s.queue),
        finished=tuple({r: Finished(f.instance_id, at(f.at_ms)) for r, f in g.items()} for g in s.finished),
        sessions={k: replace(b, used_ms=at(b.used_ms)) for k, b in s.sessions.items()},
        states={k: replace(r, bound_ms=at(r.bound_ms)) for k, r in s.states.items()},
        deleted=replace(s.deleted, at_ms=at(s.deleted.at_ms)) if s.deleted is not None else None,
        starts_held_until_ms=at(s.starts_held_until_ms),
    )


def _explains(s: FnState, e: RequestWaiting) -> FnState:
    return s  # explains a decision; changes nothing


def _features_only(s: FnState, e: Followed | Cued) -> FnState:
    return s  # what the function follows: its features learn it (features.fold), its instances are as they were


_LIFECYCLE: dict[type[Event], Callable[[FnState, Any], FnState]] = {
    FunctionSeen: _function_seen,
    RequestArrived: _request_arrived,
    RequestRetried: _request_retried,
    WaiterLeft: _waiter_left,
    RequestWaiting: _explains,
    SlotWanted: _slot_wanted,
    InstanceCreated: _instance_created,
    InstanceReady: _instance_ready,
    Assigned: _assigned,
    Released: _released,
    KeptAlive: _kept_alive,
    RequestFailed: _request_ended,
    RequestCancelled: _request_ended,
    InstanceRetired: _instance_retired,
    InstanceDestroyed: _instance_destroyed,
    FunctionRested: _function_rested,
    FunctionForgotten: _function_forgotten,
    SessionBound: _session_bound,
    SessionEnded: _session_ended,
    FunctionRestarted: _function_restarted,
    FunctionDeleted: _function_deleted,
    Followed: _features_only,
    Cued: _features_only,
    InstanceToRetire: _instance_to_retire,
    StateBound: _state_bound,
    StateDeleted: _state_deleted,
    LimitsSet: _limits_set,
    PolicySet: _policy_set,
    VersionSet: _version_set,
    TenantSet: _tenant_set,
    FunctionCreated: _function_created,
    StartsHeld: _starts_held,
    ClockRebased: _clock_rebased,
}


def _put(s: FnState, inst: Instance) -> FnState:
    return replace(s, instances={**s.instances, inst.id: inst})


def _gone(s: FnState, instance_id: str, at_ms: int) -> FnState:
    """The instance is gone: its slot time is closed (an orphan slot found later, no memory of ours, holds none)."""
    inst = s.instances.get(instance_id)
    if inst is None:
        return s
    closed = inst.memory_mb / 1024 * (at_ms - inst.wanted_ms)
    instances = {i: kept for i, kept in s.instances.items() if i != instance_id}
    return replace(s, instances=instances, slot_gb_ms=s.slot_gb_ms + closed)


def _dequeue(s: FnState, request_id: str) -> FnState:
    return replace(s, queue=tuple(p for p in s.queue if p.request_id != request_id))


def _waiters(s: FnState, request_id: str, change: Callable[[tuple[str, ...]], tuple[str, ...]]) -> FnState:
    """Change who waits for a request's answer: while it is queued, or once an instance serves it."""
    queue = tuple(replace(p, waiters=change(p.waiters)) if p.request_id == request_id else p for p in s.queue)
    held = {i.id: replace(i, waiters=change(i.waiters)) for i in s.instances.values() if i.serves(request_id)}
    return replace(s, queue=queue, instances={**s.instances, **held} if held else s.instances)


class Held(msgspec.Struct, frozen=True, array_like=True):
    """A tenant's instances: started on demand, and kept as its functions' reserved ones (min_warm)."""

    on_demand: int = 0
    reserved: int = 0

    def plus(self, other: "Held", sign: int = 1) -> "Held":
        return Held(self.on_demand + sign * other.on_demand, self.reserved + sign * other.reserved)


NOTHING_HELD = Held()


def held(s: FnState | None) -> Held:
    """What a function's instances count against its tenant's quotas (retiring ones too: they hold a slot)."""
    if s is None or not s.instances:
        return NOTHING_HELD
    reserved = sum(1 for i in s.instances.values() if i.reserved)
    return Held(len(s.instances) - reserved, reserved)
