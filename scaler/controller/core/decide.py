"""Decisions: a command and the current state in; events, replies and the next deadline out.

A decision has two halves, so that a caller waits only for the first. `respond` is what the command's
caller waits for: the command's own change, one handler per command (`_queue_request` for an Assign,
`_release` for an Idle, `_cancel`, `_slot_created`, `_instance_ready` for SlotReady, `_creation_failed`
for SlotFailed, `_slot_destroyed`, `_reconcile`, an operator's `_operator` for Restart and Delete,
`_cued` for a Cue; a Tick changes nothing by itself), then what serves the function's waiting requests
(`_serve`): leases, matching (`_answer_waiting_requests`, where a queued Assign gets its instance and
its answer), starts and throttling. `plan` brings the function to rest after that (`_rest`): keep or
retire idle instances, sessions' ends, pre-warm, rest or forget. The node answers from `respond` and
plans after the reply, once for all the commands that queued meanwhile; `decide` is both in a row,
the decision at rest (the offline simulator's, and the same events as the node's when nothing queues).

Sessions: an Assign may name a session; its request prefers the instance bound to the session (the
one that served it last). When that one is busy the request waits for it, up to `session_wait_ms`,
before it takes another instance like any request and the session moves there (`SessionBound`). A
binding ends with its instance or after the session's idle time (`SessionEnded`).

Stateful routes: an Assign may name a state; its request runs on the instance that holds the state,
waiting for it while it is busy, however long. The state's first request takes an instance no state
holds (or one starts for it) and binds the state there (`StateBound`) until an operator deletes it;
if that instance goes, the state's next request binds it anew. An instance holding a state serves
that state's requests alone and is kept alive while it holds it.

Tenants, versions and tombstones: an Assign may name its tenant (the limits file's wins) and its
version; a new version retires instances of other versions as they become idle, never mid-request.
A deleted function's Assigns are refused (NOT_FOUND) until an operator creates it again, or an
Assign names another version than the deleted one's. An operator's commands on one instance, a
state or the function's settings are in operator.py.

Leaders: a function called by another comes back from its lulls shortly after that other one does. For a
policy that follows leaders, an Assign that brings a function back records the functions that came back
within FOLLOW_MS before it (`Followed`, from the run's totals); the ledger then sends it a Cue when one of
them comes back while it has no instance (`Cued`, a trial the function's next call decides), and the
policy may pre-warm it.

Each half applies each event as it emits it, so every later choice sees the state that earlier ones
produced, and `Decision.state` equals `replay(s, Decision.events)`. The function's features (`features`: what its
events say of it, features.py) are folded beside the state, given in and handed back in `Decision.features`, and
are what the policies learn from.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from scaler.controller.core import folds, operator, reconcile
from scaler.controller.core.features import (
    FOLLOW_MS,
    NO_STATS,
    UNKNOWN_START_MS,
    FnStats,
    comes_back,
    start_bound_ms,
)
from scaler.controller.core.limits import NO_ROOM, Room
from scaler.controller.core.operator import misfit, retire_past_max
from scaler.controller.core.policy import UNSEEN, Capability, Policy, RunView
from scaler.controller.core.state import FnState, Instance, Pending, Phase
from scaler.controller.core.totals import Totals
from scaler.proto.commands import (
    QUOTA_STATUS,
    AnyCommand,
    Assign,
    Cancel,
    Code,
    Configure,
    Create,
    Cue,
    Delete,
    DeleteState,
    Idle,
    Reconcile,
    Reply,
    Restart,
    SlotCreated,
    SlotDestroyed,
    SlotFailed,
    SlotReady,
    Stop,
    Tick,
)
from scaler.proto.events import (
    Assigned,
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
    KeptAlive,
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
    TenantSet,
    VersionSet,
    WaiterLeft,
)

RESERVED_RECHECK_MS = 60_000  # how often a reserved (min warm) instance's keep-alive is renewed
# A session's request waits for its busy instance at most as long as a new instance takes to start (the
# function's last CreateSlot + Init; 1 s before it is known), and never more than this. Moving costs the
# session what it kept on its instance (a warm cache, a loaded model, a conversation), which is what a
# cold start costs any request; so waiting that long is worth it, and waiting longer never is: an
# instance started at once would have served it by then. Sessions' requests are mostly sequential (the
# next one comes after the last one's answer), so their bound instance is rarely busy at all.
MAX_SESSION_WAIT_MS = 10_000
# While the platform worker's circuit holds a function's starts (StartsHeld), a request nothing else covers waits
# this long at most for an instance of the function to free up, or for the hold to end (then it gets a start), so
# its caller hears "not now" (Throttle) well within a usual deadline rather than wait out the hold or fail with a
# start; not at once, which a caller that repeats at once would turn into a stream of refusals.
HELD_WAIT_MS = 2_000
LOST_START = "a lost start"  # how a retirement's reason ends for an instance not ready within its start's bound
LEASE_LAPSED = "no Idle within"  # how a release's reason begins for a request busy past its function's timeout


class Decision(NamedTuple):
    events: list[Event]
    replies: list[Reply]
    state: FnState  # the state after the events
    wake_ms: int | None  # when the function next wants a Tick
    features: FnStats = NO_STATS  # the function's features after the events (features.fold)


class _Draft:
    """A decision being built: events are applied as they are emitted."""

    def __init__(
        self, s: FnState, now: int, room: Room = NO_ROOM, run: RunView = UNSEEN, features: FnStats = NO_STATS
    ) -> None:
        self.s = s
        self.f = features  # what the function's events say of it, folded beside `s`
        self.now = now
        self.room = room
        self.run = run  # the whole run as this decision sees it, worked out once: every policy call gets it
        self.started = 0  # instances this decision starts: they count against caps over all functions
        self.events: list[Event] = []
        self.replies: list[Reply] = []

    def held(self) -> bool:
        """Whether the function's starts are held (StartsHeld): the platform worker's circuit is open."""
        return self.now < self.s.starts_held_until_ms

    def may_start(self, wanted: int, reserved: bool = False) -> int:
        """As many of `wanted` new instances as the caps and the tenant's quota (on demand, or `reserved`) allow;
        none while the function's starts are held."""
        if self.held():
            return 0
        allowed = self.room.starts(self.s, self.started)
        if self.room.quota is not None and (left := self.room.tenant_left(self.s, reserved)) is not None:
            allowed = max(0, left) if allowed is None else min(allowed, max(0, left))
        return wanted if allowed is None else min(wanted, allowed)

    def start(self, for_request: str = "", why: str = "", reserved: bool = False) -> None:
        self.started += 1
        self.emit(
            SlotWanted(
                at_ms=self.now,
                instance_id=self.s.next_instance_id(),
                meta=self.s.meta,
                for_request=for_request,
                reason=why,
                version=self.s.version,
                reserved=reserved,
            )
        )

    def emit(self, e: Event) -> None:
        self.events.append(e)
        self.s, self.f = folds.apply((self.s, self.f), e)

    def reply(self, to: str, request_id: str, code: Code = Code.OK, instance_id: str = "", message: str = "") -> None:
        if to:
            self.replies.append(
                Reply(to=to, request_id=request_id, code=code, instance_id=instance_id, message=message)
            )

    def reply_all(self, waiters: tuple[str, ...], request_id: str, **kw) -> None:
        for to in waiters:
            self.reply(to, request_id, **kw)


def decide(
    s: FnState,
    cmd: AnyCommand,
    now: int,
    policy: Policy,
    totals: Totals | None = None,
    room: Room = NO_ROOM,
    features: FnStats = NO_STATS,
) -> Decision:
    """`respond` then `plan`, as one decision at rest. `totals`: the whole run so far, which the policy sees
    through its view (`RunView.of`, once per decision); `room`: the caps and reserved instances the operator
    set (scaler/controller/core/limits.py); `features`: what the function's events say of it, folded beside
    `s`, handed to the policy with it."""
    d = _Draft(s, now, room, RunView.of(totals, now), features)
    asked = _respond(d, cmd, totals, policy)
    planned = _rest(d, policy)
    return Decision(d.events, d.replies, d.s, _earliest(asked, planned), d.f)


def respond(
    s: FnState,
    cmd: AnyCommand,
    now: int,
    policy: Policy,
    totals: Totals | None = None,
    room: Room = NO_ROOM,
    features: FnStats = NO_STATS,
) -> Decision:
    """What the command's caller waits for: its own change, and what serves the waiting requests.

    Its `wake_ms` is the earliest of its own deadlines (a lease, a recheck of the waiting, a
    throttle, a session's wait); `plan`'s are apart."""
    d = _Draft(s, now, room, RunView.of(totals, now), features)
    wake = _respond(d, cmd, totals, policy)
    return Decision(d.events, d.replies, d.s, wake, d.f)


def plan(
    s: FnState,
    now: int,
    policy: Policy,
    totals: Totals | None = None,
    room: Room = NO_ROOM,
    features: FnStats = NO_STATS,
) -> Decision:
    """The function brought to rest: keep-alives, retirements, sessions' ends, pre-warms, rest. No replies.

    Its `wake_ms` is the earliest of its own deadlines (a keep-alive, a planned pre-warm, a session's
    idle end, rest); `respond`'s are apart."""
    d = _Draft(s, now, room, RunView.of(totals, now), features)
    wake = _rest(d, policy)
    return Decision(d.events, [], d.s, wake, d.f)


def _respond(d: "_Draft", cmd: AnyCommand, totals: Totals | None, policy: Policy) -> int | None:
    match cmd:
        case Assign():
            _queue_request(d, cmd, totals, policy)
        case SlotReady():
            _instance_ready(d, cmd, policy)
        case _:
            change = _CHANGES.get(type(cmd))
            if change is None:
                raise TypeError(f"not a command: {cmd!r}")
            change(d, cmd)
    return _serve(d, policy)


def _earliest(*wakes: int | None) -> int | None:
    return min((w for w in wakes if w is not None), default=None)


# --- each command's own change --------------------------------------------------------------


def _holder(s: FnState, request_id: str) -> Instance | None:
    """The instance serving the request now. An idle one keeps the id of the last request it served: after a
    cancelled assignment the retry is served anew, and the idle instance must not hide the busy one."""
    return next((i for i in s.in_phase(Phase.BUSY) if i.request_id == request_id), None)


def _queue_request(d: _Draft, cmd: Assign, totals: Totals | None, policy: Policy) -> None:
    """Queue the request (matching answers it), or answer at once: bad input, or a request already served.

    For a policy that follows leaders: if this call brings the function back from a lull shortly after
    other functions came back (the run's `totals` say which), it may be one they call (`Followed`)."""
    r, to = cmd.request_id, cmd.reply_to
    if cmd.meta.memory_mb <= 0:
        d.reply(to, r, Code.INVALID_ARGUMENT, message=f"memory_in_mb must be positive, got {cmd.meta.memory_mb}")
        return
    if d.s.deleted is not None and not _created_by(d, cmd):
        d.reply(to, r, Code.NOT_FOUND, message=_tombstone(d.s))
        return
    if (waiting := d.s.pending(r)) is not None:  # asked again while queued: answer this caller too
        if to and to not in waiting.waiters:
            d.emit(RequestRetried(at_ms=d.now, request_id=r, reply_to=to))
        return
    if (held := _holder(d.s, r)) is not None:
        if to and to not in held.waiters:  # a new caller of the request: its Cancel must not free it alone
            d.emit(RequestRetried(at_ms=d.now, request_id=r, reply_to=to))
        d.reply(to, r, instance_id=held.id)
        return
    if (done := d.s.finished_on(r, d.now)) is not None:
        d.reply(to, r, Code.FAILED_PRECONDITION, message=f"request {r} already finished on instance {done}")
        return
    if d.s.meta != cmd.meta:
        d.emit(FunctionSeen(at_ms=d.now, meta=cmd.meta))
    _named(d, cmd)
    if policy.can(Capability.FOLLOWS_LEADERS) and totals is not None and comes_back(d.f, d.now):
        if leads := totals.leads(d.s.key, d.now):
            d.emit(Followed(at_ms=d.now, leads=leads))
    d.emit(RequestArrived(at_ms=d.now, request_id=r, reply_to=to, session=cmd.session, state=cmd.state))


def _created_by(d: _Draft, cmd: Assign) -> bool:
    """A deleted function is created again by an Assign that names another version than the deleted one's."""
    if not cmd.version or cmd.version == d.s.deleted.version:
        return False
    d.emit(FunctionCreated(at_ms=d.now, version=cmd.version, reason=f"an Assign named version {cmd.version}"))
    return True


def _tombstone(s: FnState) -> str:
    why = f": {s.deleted.reason}" if s.deleted.reason else ""
    return (
        f"function {s.key!r} was deleted{why}; it serves calls again once created"
        " (`scaler create`) or called at another version"
    )


def _named(d: _Draft, cmd: Assign) -> None:
    """What the call says of its function: its tenant (the limits file's wins) and its version."""
    if d.room.tenant and d.room.tenant != d.s.tenant:
        by = "the limits file's" if d.room.file.tenant else "named by the caller"
        d.emit(TenantSet(at_ms=d.now, tenant=d.room.tenant, reason=by))
    if cmd.version and cmd.version != d.s.version:
        d.emit(VersionSet(at_ms=d.now, version=cmd.version, reason=f"{cmd.request_id} named it"))


def _cued(d: _Draft, cmd: Cue) -> None:
    """A function this one follows came back: a trial of that lead while this one has no instance (with one,
    it needs no pre-warm), which the pre-warm at rest may act on. A cue older than FOLLOW_MS is stale."""
    if not d.s.nothing_live():
        return
    if d.now - cmd.at_ms <= FOLLOW_MS and any(x.key == cmd.leader and not x.failed() for x in d.f.leaders):
        d.emit(Cued(at_ms=d.now, leader=cmd.leader))


def _release(d: _Draft, cmd: Idle) -> None:
    r, to = cmd.request_id, cmd.reply_to
    inst = d.s.instances.get(cmd.instance_id)
    released = d.s.finished_on(r, d.now) == cmd.instance_id
    if released and (inst is None or inst.request_id != r or inst.phase is not Phase.BUSY):
        d.reply(to, r, message=f"instance {cmd.instance_id} was already released by request {r}")  # a retried Idle
    elif inst is None:
        d.reply(to, r, Code.NOT_FOUND, message=f"no instance {cmd.instance_id!r} for metaKey {cmd.key!r}")
    elif inst.request_id != r:
        held = f"serves request {inst.request_id!r}" if inst.phase is Phase.BUSY else "is not assigned to it"
        d.reply(to, r, Code.FAILED_PRECONDITION, message=f"instance {inst.id!r} {held}, not request {r!r}")
    elif inst.phase is not Phase.BUSY:
        d.reply(to, r, message=f"instance {inst.id} was already released by request {r}")  # a retried Idle
    else:
        d.emit(
            Released(
                at_ms=d.now,
                request_id=r,
                instance_id=inst.id,
                status_code=cmd.status_code,
                duration_ms=cmd.duration_ms,
                reason=cmd.reason,
                need_destroy=cmd.need_destroy,
            )
        )
        if cmd.need_destroy:
            why = f"need_destroy: {cmd.reason}" if cmd.reason else "need_destroy"
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
        elif inst.retire_on_release:
            why = f"{inst.retire_on_release}: retired once released"
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
        d.reply(to, r, instance_id=inst.id)


def _cancel(d: _Draft, cmd: Cancel) -> None:
    r = cmd.request_id
    why = cmd.reason or "caller gave up"
    if (waiting := d.s.pending(r)) is not None:
        others = tuple(w for w in waiting.waiters if w != cmd.reply_to)
        if not cmd.reply_to or not others:
            d.emit(RequestCancelled(at_ms=d.now, request_id=r, reason=why))
        elif len(others) < len(waiting.waiters):
            d.emit(WaiterLeft(at_ms=d.now, request_id=r, reply_to=cmd.reply_to))
    elif (held := _holder(d.s, r)) is not None:
        # Release only when no other caller of this request got the instance and still holds it.
        if not cmd.reply_to or held.waiters in ((), (cmd.reply_to,)):
            why = f"cancelled: {why}"
            d.emit(Released(at_ms=d.now, request_id=r, instance_id=held.id, status_code=0, reason=why, cancelled=True))


def _retire_orphan(d: _Draft, instance_id: str, slot_id: str, why: str) -> None:
    """A slot nothing in the state owns: record it under its own id so that it gets destroyed (once)."""
    orphan = f"{instance_id}@{slot_id}"
    if orphan not in d.s.instances:
        d.emit(InstanceRetired(at_ms=d.now, instance_id=orphan, slot_id=slot_id, reason=why))


def _being_created_on(inst: Instance | None, slot_id: str) -> bool:
    """Whether a report is about the creation under way: the instance is still being created, and on the slot
    recorded for it (or none is recorded yet, or the report names none), not on one given up for another."""
    return inst is not None and inst.phase is Phase.CREATING and (not slot_id or inst.slot_id in ("", slot_id))


def _slot_created(d: _Draft, cmd: SlotCreated) -> None:
    """CreateSlot answered, Init sent beside this report: record the slot, or retire it when its instance is no
    longer being created. The worker reports the start's outcome only on an OK answer (else it drops the Init).
    A second slot replaces the first (a worker gave up on it, its Init may have run), which is destroyed; a slot
    given up is never taken back."""
    inst = d.s.instances.get(cmd.instance_id)
    r, to = cmd.instance_id, cmd.reply_to
    given_up = f"{cmd.instance_id}@{cmd.slot_id}" in d.s.instances
    if inst is None or inst.phase is not Phase.CREATING or given_up:
        if inst is None or inst.slot_id != cmd.slot_id:
            _retire_orphan(d, cmd.instance_id, cmd.slot_id, "created for an instance no longer wanted")
        d.reply(to, r, Code.FAILED_PRECONDITION, message=f"instance {cmd.instance_id} is no longer being created")
        return
    if inst.slot_id != cmd.slot_id:
        if inst.slot_id:
            _retire_orphan(d, inst.id, inst.slot_id, f"replaced by {cmd.slot_id}")
        d.emit(InstanceCreated(at_ms=d.now, instance_id=inst.id, slot_id=cmd.slot_id, create_ms=cmd.create_ms))
    d.reply(to, r, instance_id=inst.id)


def _instance_ready(d: _Draft, cmd: SlotReady, policy: Policy) -> None:
    """The instance is ready; with dedicated starts it serves the request it was started for, if that still waits."""
    inst = d.s.instances.get(cmd.instance_id)
    if _being_created_on(inst, cmd.slot_id):
        d.emit(
            InstanceReady(
                at_ms=d.now, instance_id=inst.id, slot_id=cmd.slot_id, create_ms=cmd.create_ms, init_ms=cmd.init_ms
            )
        )
        own = d.s.pending(inst.for_request) if policy.can(Capability.DEDICATED_STARTS) else None
        if own is not None and _fits(d.s, inst) and not _holding(d.s, d.f, own, d.now):
            _assign(d, own, inst)
    elif inst is None or inst.slot_id != cmd.slot_id:  # not a repeated report: a slot we did not want
        _retire_orphan(d, cmd.instance_id, cmd.slot_id, "ready for an instance no longer wanted")


def _creation_failed(d: _Draft, cmd: SlotFailed) -> None:
    inst = d.s.instances.get(cmd.instance_id)
    if not _being_created_on(inst, cmd.slot_id):
        if cmd.slot_id and (inst is None or inst.slot_id != cmd.slot_id):
            _retire_orphan(d, cmd.instance_id, cmd.slot_id, f"failed creation of an unknown instance: {cmd.reason}")
        return
    slot = cmd.slot_id or inst.slot_id  # CreateSlot answered before (InstanceCreated), or Init failed on it
    d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=slot, reason=f"creation failed: {cmd.reason}"))
    if cmd.retry_after_ms > 0:  # refused by the worker's open circuit: no start of the function until it may go
        d.emit(StartsHeld(at_ms=d.now, until_ms=d.now + cmd.retry_after_ms, reason=cmd.reason))
    if d.held() or _may_free(d.s):
        return  # a waiting request that lost its instance waits for one to free up, or is throttled (`_throttle`)
    if len(d.s.queue) > len(d.s.in_phase(Phase.CREATING)):  # a waiting request lost its instance
        victim = d.s.pending(inst.for_request) or d.s.queue[0]
        message = f"the platform could not start an instance: {cmd.reason}"
        d.emit(RequestFailed(at_ms=d.now, request_id=victim.request_id, message=message))
        d.reply_all(victim.waiters, victim.request_id, code=Code.INTERNAL, message=message)


def _slot_destroyed(d: _Draft, cmd: SlotDestroyed) -> None:
    if cmd.instance_id in d.s.instances:
        d.emit(InstanceDestroyed(at_ms=d.now, instance_id=cmd.instance_id, slot_id=cmd.slot_id))


def _reconcile(d: _Draft, cmd: Reconcile) -> None:
    """The platform's live slots against the state: the rules are in `reconcile.py`."""
    for e in reconcile.events(d.s, cmd, d.now):
        d.emit(e)


def _operator(d: _Draft, cmd: Restart | Delete | Stop | DeleteState) -> None:
    """An operator's command, about a function this node knows (one it never saw, or forgot, is NOT_FOUND)."""
    if d.s.deleted is not None:
        d.reply(cmd.reply_to, "", Code.NOT_FOUND, message=_tombstone(d.s))
    elif not _known(d.s):
        d.reply(cmd.reply_to, "", Code.NOT_FOUND, message=f"no function {cmd.key!r}")
    elif isinstance(cmd, Restart) and cmd.instance_id:
        operator.restart_instance(d, cmd)
    elif isinstance(cmd, Restart):
        _restart(d, cmd)
    elif isinstance(cmd, Stop):
        operator.stop(d, cmd)
    elif isinstance(cmd, DeleteState):
        operator.delete_state(d, cmd)
    else:
        _delete(d, cmd)


def _restart(d: _Draft, cmd: Restart) -> None:
    """An operator's restart: idle instances retire now, busy ones once released (`Instance.restarting`)."""
    why = f"restarted: {cmd.reason}" if cmd.reason else "restarted"
    idle, busy = d.s.in_phase(Phase.IDLE), d.s.in_phase(Phase.BUSY)
    d.emit(FunctionRestarted(at_ms=d.now, reason=cmd.reason))
    for inst in idle:
        d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
    message = f"{len(idle)} idle instance(s) retired, {len(busy)} busy one(s) retire when released"
    d.reply(cmd.reply_to, "", message=message)


def _delete(d: _Draft, cmd: Delete) -> None:
    """An operator's delete: waiting requests fail, every instance retires, and the function is forgotten."""
    why = f"function deleted: {cmd.reason}" if cmd.reason else "function deleted"
    for waiting in d.s.queue:
        d.emit(RequestFailed(at_ms=d.now, request_id=waiting.request_id, message=why))
        d.reply_all(waiting.waiters, waiting.request_id, code=Code.NOT_FOUND, message=why)
    live = [i for i in d.s.instances.values() if i.phase is not Phase.RETIRING]
    for inst in live:
        d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
    d.emit(FunctionDeleted(at_ms=d.now, reason=cmd.reason))
    d.reply(
        cmd.reply_to, "", message=f"{len(live)} instance(s) retired; its calls are refused until it is created again"
    )


def _known(s: FnState) -> bool:
    return s.meta is not None or not s.nothing_live()


def _tick(d: _Draft, cmd: Tick) -> None:
    pass  # what is due happens at rest


# The commands whose own change needs neither the policy nor the run's totals.
_CHANGES: dict[type, Callable[[_Draft, Any], None]] = {
    Idle: _release,
    Cancel: _cancel,
    SlotCreated: _slot_created,
    SlotFailed: _creation_failed,
    SlotDestroyed: _slot_destroyed,
    Reconcile: _reconcile,
    Restart: _operator,
    Delete: _operator,
    Stop: _operator,
    DeleteState: _operator,
    Configure: operator.configure,
    Create: operator.create,
    Tick: _tick,
    Cue: _cued,
}


# --- serving the waiting, then at rest: the phases every decision ends with, in this order ----


def _serve(d: _Draft, policy: Policy) -> int | None:
    """What follows any command's own change: the function's waiting requests served as they can be.

    Leases first, then matching before anything else, so an Assign that raced a late timer still gets
    the instance. Returns when its own deadlines next need a Tick.
    """
    _free_lost_leases(d)
    _retire_lost_starts(d)
    _answer_waiting_requests(d, policy)
    recheck_ms = _start_instances_for_waiting(d, policy)
    throttle_ms = _throttle(d, policy)
    return _next_wake(d, recheck_ms, throttle_ms, *_serving_deadlines(d.s, d.f, d.now))


def _rest(d: _Draft, policy: Policy) -> int | None:
    """Bring the function to a resting point; return when its plans next need a Tick.

    The core's invariants hold at rest: no request waits while an instance idles, every idle
    instance has a keep-alive, none outlives it.
    """
    _keep_or_retire_idle(d, policy)
    _end_sessions(d)
    prewarm_ms = _prewarm(d, policy)
    rest_ms = _rest_or_forget(d)
    return _next_wake(d, prewarm_ms, rest_ms, *_resting_deadlines(d.s, d.room))


def _free_lost_leases(d: _Draft) -> None:
    """Leases: a request busy past its function's timeout lost its caller (no Idle will come).

    Its instance is freed and retired, as the run may have left it in any state.
    """
    lease = d.s.lease_ms()
    given = "the function's" if d.s.meta is not None and d.s.meta.timeout_s > 0 else "the default"
    for inst in d.s.in_phase(Phase.BUSY):
        if inst.since_ms + lease <= d.now:
            why = f"{LEASE_LAPSED} {given} {d.s.timeout_s()}s timeout"
            d.emit(Released(at_ms=d.now, request_id=inst.request_id, instance_id=inst.id, status_code=0, reason=why))
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))


def _retire_lost_starts(d: _Draft) -> None:
    """Lost starts: an instance being created past its bound is retired (its slot destroyed, should it ever be
    reported), so it no longer covers a waiting request: the request gets a start of its own again."""
    bound = start_bound_ms(d.f)
    for inst in d.s.in_phase(Phase.CREATING):
        if inst.since_ms + bound <= d.now:
            why = f"not ready within {bound / 1000:g}s (its function's last start and a margin): {LOST_START}"
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))


def _fits(s: FnState, inst: Instance) -> bool:
    """Whether the instance may run the function's requests now: the memory it asks for (its meta may have grown
    since), its runtime and its version (operator.misfit says why not; this is the same, on the hot path)."""
    m = s.meta
    if m is not None and (inst.memory_mb < m.memory_mb or (inst.runtime != m.runtime and inst.runtime)):
        return False
    return inst.version == s.version


def _answer_waiting_requests(d: _Draft, policy: Policy) -> None:
    """Matching, where an Assign is answered: each waiting request, oldest first, takes an idle instance
    with enough memory, the policy's pick among those no session is bound to if there are any.

    With dedicated starts a request whose own instance is being created waits for that one. A
    session's request takes its bound instance when idle, and waits while it is busy (`_holding`).
    """
    if not d.s.queue:  # nothing waits (an Idle, a warm Assign once matched): the rest would find no request
        return
    held: set[str] = set()
    while (free := _free_to_take(d.s, d.f, policy)) and (
        idle := [i for i in d.s.in_phase(Phase.IDLE) if _fits(d.s, i)]
    ):
        waiting = next((p for p in free if p.request_id not in held), None)
        if waiting is None:
            return
        bound = _holding_state(d.s, waiting.state) if waiting.state else _bound(d.s, waiting.session)
        if bound is not None and bound.phase is Phase.IDLE and _fits(d.s, bound):
            inst = bound
        elif _holding(d.s, d.f, waiting, d.now):
            held.add(waiting.request_id)
            continue
        else:
            if d.s.states:  # an instance that holds a state serves that state's requests alone
                idle = [i for i in idle if not d.s.holder(i.id)]
                if not idle:
                    held.add(waiting.request_id)
                    continue
            taken = {b.instance_id for b in d.s.sessions.values()}
            inst = policy.pick(d.s, d.f, [i for i in idle if i.id not in taken] or idle, d.now, d.run)
        _assign(d, waiting, inst)


def _assign(d: _Draft, waiting: Pending, inst: Instance) -> None:
    """The request gets the instance, and its callers their answer; a session or a state not bound to it moves
    to it."""
    route = d.s.states.get(waiting.state) if waiting.state else None
    if waiting.state and (route is None or route.instance_id != inst.id):
        was = d.s.instances.get(route.instance_id) if route else None
        if route is None:
            why = "the state's first request"
        elif was is None or was.phase is Phase.RETIRING:
            why = f"its instance {route.instance_id} went"
        else:
            why = f"its instance {was.id} may not serve it: " + (was.retire_on_release or misfit(d.s, was))
        r = waiting.request_id
        d.emit(StateBound(at_ms=d.now, state=waiting.state, instance_id=inst.id, request_id=r, why=why))
    was = d.s.sessions.get(waiting.session) if waiting.session else None
    if waiting.session and (was is None or was.instance_id != inst.id):
        if was is None:
            why = "the session's first request here"
        elif _bound(d.s, waiting.session) is None:
            why = f"its instance {was.instance_id} is gone"
        else:
            why = f"its instance {was.instance_id} stayed busy past the wait"
        r = waiting.request_id
        d.emit(SessionBound(at_ms=d.now, session=waiting.session, instance_id=inst.id, request_id=r, why=why))
    d.emit(Assigned(at_ms=d.now, request_id=waiting.request_id, instance_id=inst.id))
    d.reply_all(waiting.waiters, waiting.request_id, instance_id=inst.id)


def _holding_state(s: FnState, state: str) -> Instance | None:
    """The instance that holds the state, while it may serve it (not retiring nor to retire, of the function's
    version): otherwise the state's next request binds it anew."""
    route = s.states.get(state)
    inst = s.instances.get(route.instance_id) if route is not None else None
    if inst is None or inst.phase is Phase.RETIRING or inst.retire_on_release or not _fits(s, inst):
        return None
    return inst


def _bound(s: FnState, session: str) -> Instance | None:
    """The session's instance, while it may still serve (idle, busy or being created)."""
    b = s.sessions.get(session) if session else None
    inst = s.instances.get(b.instance_id) if b is not None else None
    return inst if inst is not None and inst.phase is not Phase.RETIRING else None


def session_wait_ms(st: FnStats) -> int:
    """How long a session's request waits for its busy instance (see MAX_SESSION_WAIT_MS)."""
    return min(st.start_ms or UNKNOWN_START_MS, MAX_SESSION_WAIT_MS)


def _holding(s: FnState, st: FnStats, waiting: Pending, now: int) -> bool:
    """Whether a session's request still waits for its bound instance, busy now, rather than take another; a
    state's request waits for the instance holding its state as long as that one is busy."""
    if waiting.state:
        inst = _holding_state(s, waiting.state)
        return inst is not None and inst.phase is Phase.BUSY
    bound = _bound(s, waiting.session)
    return (
        bound is not None
        and bound.phase is Phase.BUSY
        and now < waiting.since_ms + session_wait_ms(st)
        and _fits(s, bound)
    )


def _start_instances_for_waiting(d: _Draft, policy: Policy) -> int | None:
    """Starts: for waiting requests no instance under creation covers, the policy starts some, the rest wait.

    Returns when the policy wants to look again at those left waiting. A session's request that waits
    for its own busy instance gets no start (and says so when it arrives).
    """
    if not d.s.queue:
        return None
    for waiting in d.s.queue if d.s.sessions or d.s.states else ():
        if waiting.since_ms == d.now and _holding(d.s, d.f, waiting, d.now):
            if waiting.state:
                why, expected = f"waits for {d.s.states[waiting.state].instance_id}, busy, which holds its state", 0
            else:
                bound, wait_ms = d.s.sessions[waiting.session].instance_id, session_wait_ms(d.f)
                why, expected = f"waits up to {wait_ms} ms for its session's instance {bound}, busy", d.now + wait_ms
            d.emit(RequestWaiting(at_ms=d.now, request_id=waiting.request_id, expected_ms=expected, why=why))
    uncovered = _uncovered(d.s, d.f, policy, d.now)
    if not uncovered or d.s.meta is None:
        return None
    plan = policy.plan_queue(d.s, d.f, len(uncovered), d.now, d.run)
    starts = d.may_start(plan.starts)
    for waiting in uncovered[:starts]:
        d.start(for_request=waiting.request_id, why=plan.why)
    if starts == plan.starts and plan.ahead:
        for _ in range(d.may_start(plan.ahead)):
            d.start(why="ahead of the burst: its next calls come before a start is ready")
    capped = f"at the cap ({_caps(d.s, d.room)}): waits for an instance to free up" if starts < plan.starts else ""
    if capped and d.held():
        capped = "the function's starts are held (the platform's circuit is open): waits for an instance to free up"
    for waiting in uncovered[starts:]:
        if waiting.since_ms == d.now:  # say so once, when it arrives
            r, expected = waiting.request_id, plan.expected_ms
            d.emit(RequestWaiting(at_ms=d.now, request_id=r, expected_ms=expected, why=capped or plan.why))
    return plan.recheck_ms


def _free_to_take(s: FnState, st: FnStats, policy: Policy) -> tuple[Pending, ...]:
    """The waiting requests that may take any idle instance: all, or with dedicated starts those without their own."""
    return _uncovered(s, st, policy) if policy.can(Capability.DEDICATED_STARTS) else s.queue


def _uncovered(s: FnState, st: FnStats, policy: Policy, now: int | None = None) -> tuple[Pending, ...]:
    """The waiting requests no instance under creation is for: with dedicated starts, those without
    one started for them; else any creation covers one, the oldest first. Given `now`, without the
    sessions' requests that still wait for their busy instance."""
    creating = [i for i in s.in_phase(Phase.CREATING) if _fits(s, i)]
    queue = s.queue
    if now is not None and (s.sessions or s.states):
        queue = tuple(p for p in queue if not _holding(s, st, p, now))
    if policy.can(Capability.DEDICATED_STARTS):
        own = {i.for_request for i in creating}
        return tuple(p for p in queue if p.request_id not in own)
    return queue[len(creating) :]


def _caps(s: FnState, room: Room) -> str:
    """The caps that may hold the function back, by the limits file's own keys."""
    lim = room.limits
    named = [
        f"max_instances {lim.max_instances}" if lim.max_instances else "",
        f"max_memory_mb {lim.max_memory_mb}" if lim.max_memory_mb else "",
    ]
    named += [
        "the caps over all functions" if room.instances_left is not None or room.memory_left_mb is not None else ""
    ]
    if room.quota is not None and room.quota.max_on_demand:
        named.append(f"tenant {room.tenant}'s max_on_demand {room.quota.max_on_demand}")
    return ", ".join(n for n in named if n) or "no cap"


def _quota_holds(d: _Draft) -> bool:
    """Whether the tenant's on-demand quota is what holds the function back (the caps may too)."""
    left = d.room.tenant_left(d.s, False)
    return left is not None and left <= 0


def _may_free(s: FnState) -> bool:
    """Whether an instance of the function may free up for a waiting request: one is busy, and fits it."""
    return any(_fits(s, i) for i in s.in_phase(Phase.BUSY))


def _throttle(d: _Draft, policy: Policy) -> int | None:
    """Throttle: a request nothing can start for (a cap, or the function's starts held) that waited its time for an
    instance to free up is answered Throttle: at a cap, after the limits' `throttle_after_ms`; while starts are
    held, after HELD_WAIT_MS (no longer than that); a hold that ends sooner starts an instance for it instead.

    Returns when the next one's time is up, while any is held back.
    """
    if not d.s.queue or d.s.meta is None or d.may_start(1):
        return None
    if d.held():
        wait_ms = min(HELD_WAIT_MS, d.room.throttle_after_ms)
        left_ms = d.s.starts_held_until_ms - d.now
        why = f"no start of the function for {left_ms} ms more, the platform's circuit open ({d.s.starts_held_why}),"
    else:
        wait_ms, why = d.room.throttle_after_ms, f"at the cap ({_caps(d.s, d.room)})"
    due = []
    for waiting in _uncovered(d.s, d.f, policy, d.now):
        deadline = waiting.since_ms + wait_ms
        if deadline > d.now:
            due.append(deadline)
            continue
        message = f"throttled: {why} and no instance freed up within {wait_ms} ms"
        code = Code.THROTTLED
        if not d.held() and _quota_holds(d):
            t, q = d.room.tenant, d.room.quota.max_on_demand
            held = d.room.tenant_held(d.s).on_demand
            message = (
                f"{QUOTA_STATUS}: tenant {t} holds {held} on-demand instance(s), its quota max_on_demand {q};"
                f" no instance freed up within {wait_ms} ms"
            )
            code = Code.QUOTA
        d.emit(RequestFailed(at_ms=d.now, request_id=waiting.request_id, message=message))
        d.reply_all(waiting.waiters, waiting.request_id, code=code, message=message)
    return min(due, default=None)


def _keep_or_retire_idle(d: _Draft, policy: Policy) -> None:
    """Keep/retire: an instance that just became idle gets the policy's keep-alive; an expired one retires (kept
    while starts fail: `_kept_while_starts_fail`), and so does one with less memory than the function asks for now (no
    request may run on it again)."""
    for inst in d.s.in_phase(Phase.IDLE):
        if not _fits(d.s, inst):
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=misfit(d.s, inst)))
    if d.room.limits.max_instances or d.room.limits.max_memory_mb:
        retire_past_max(d)
    for inst in d.s.in_phase(Phase.IDLE):
        if not inst.keep_until_ms:
            keep = policy.keep_alive(d.s, d.f, inst, d.now, d.run)
            d.emit(KeptAlive(at_ms=d.now, instance_id=inst.id, until_ms=keep.until_ms, why=keep.why))
    for inst in d.s.in_phase(Phase.IDLE):
        if inst.keep_until_ms > d.now:
            continue
        if _kept_while_starts_fail(d, inst):
            continue
        if d.s.states and (state := d.s.holder(inst.id)):
            why = f"holds state {state} until it is deleted"
            d.emit(KeptAlive(at_ms=d.now, instance_id=inst.id, until_ms=d.now + RESERVED_RECHECK_MS, why=why))
            continue
        if d.room.limits.min_warm and d.room.reserved(d.s) == 0 and _live(d.s) <= d.room.limits.min_warm:
            until = d.now + RESERVED_RECHECK_MS
            why = f"reserved: the function keeps {d.room.limits.min_warm} warm"
            d.emit(KeptAlive(at_ms=d.now, instance_id=inst.id, until_ms=until, why=why))
            continue
        longer = policy.expire(d.s, d.f, inst, d.now, d.run)
        if longer is not None and longer.until_ms > d.now:
            d.emit(KeptAlive(at_ms=d.now, instance_id=inst.id, until_ms=longer.until_ms, why=longer.why))
        else:
            why = f"keep-alive expired after {(d.now - inst.since_ms) / 1000:g}s idle"
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))


def _kept_while_starts_fail(d: _Draft, inst: Instance) -> bool:
    """An idle instance past its keep-alive is kept while none could replace it: while the function's starts are held
    (the platform's circuit is open), or while the platform fails starts of any function (the room says until when;
    the function's own next start would fail too). Whether it was kept."""
    if d.held():
        why, until = (
            "kept while the function's starts are held (the platform's circuit is open)",
            d.s.starts_held_until_ms,
        )
    elif d.now < d.room.starts_failing_until_ms:
        why, until = "kept while the platform fails starts (none could replace it)", d.room.starts_failing_until_ms
    else:
        return False
    d.emit(KeptAlive(at_ms=d.now, instance_id=inst.id, until_ms=until, why=why))
    return True


def _end_sessions(d: _Draft) -> None:
    """Sessions' ends: a binding goes with its instance, or once the session has not used it for its idle time."""
    idle_ms = d.room.session_idle_ms
    for session, b in list(d.s.sessions.items()):
        inst = d.s.instances.get(b.instance_id)
        if inst is None or inst.phase is Phase.RETIRING:
            d.emit(SessionEnded(at_ms=d.now, session=session, reason=f"its instance {b.instance_id} went"))
        elif inst.session != session and b.used_ms + idle_ms <= d.now:
            d.emit(SessionEnded(at_ms=d.now, session=session, reason=f"unused for {idle_ms / 1000:g}s"))


def _prewarm(d: _Draft, policy: Policy) -> int | None:
    """Pre-warm: instances the policy starts ahead of demand. Returns when its next planned start is due."""
    if d.s.meta is None:
        return None
    warm = policy.prewarm(d.s, d.f, d.now, d.run)
    for _ in range(d.may_start(warm.count)):
        d.start(why=warm.why)
    if reserved := d.may_start(d.room.reserved(d.s), reserved=True):
        for _ in range(reserved):
            d.start(why=f"reserved: the function keeps {d.room.limits.min_warm} warm", reserved=True)
    return warm.next_ms


def _rest_or_forget(d: _Draft) -> int | None:
    """Rest and forget: a function with nothing in flight and no instance sheds what it no longer needs.

    Returns when the next step is due.
    """
    s = d.s
    if s.meta is None or s.instances or s.queue:
        return None
    idle_since = max(d.f.last_arrival_ms, d.f.last_end_ms)
    forget_at = idle_since + d.room.forget_after_ms
    if (last := s.last_release()) is not None:  # not before a retry of its last release can no longer come
        forget_at = max(forget_at, last.at_ms + s.lease_ms())
    if d.now >= forget_at:
        d.emit(FunctionForgotten(at_ms=d.now))
        return None
    if s.rested:
        return forget_at
    rest_at = idle_since + d.room.rest_after_ms
    if d.now < rest_at:
        return rest_at
    d.emit(FunctionRested(at_ms=d.now))
    return forget_at


def _live(s: FnState) -> int:
    return sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)


def _serving_deadlines(s: FnState, st: FnStats, now: int) -> list[int]:
    """Leases of busy instances, bounds of starts, and the waits of sessions' requests for their own busy instance."""
    lease, bound = s.lease_ms(), start_bound_ms(st)
    wakes = [i.since_ms + lease for i in s.in_phase(Phase.BUSY)]
    wakes += [i.since_ms + bound for i in s.in_phase(Phase.CREATING)]
    if s.queue:  # those still waiting get a start once the hold ends
        wakes.append(s.starts_held_until_ms)
    if s.sessions:
        wakes += [p.since_ms + session_wait_ms(st) for p in s.queue if not p.state and _holding(s, st, p, now)]
    return wakes


def _resting_deadlines(s: FnState, room: Room) -> list[int]:
    """Keep-alives of idle instances, and sessions' idle ends."""
    wakes = [i.keep_until_ms for i in s.in_phase(Phase.IDLE)]
    if s.sessions:
        busy = {i.session for i in s.in_phase(Phase.BUSY)}
        wakes += [b.used_ms + room.session_idle_ms for k, b in s.sessions.items() if k not in busy]
    return wakes


def _next_wake(d: _Draft, *planned: int | None) -> int | None:
    """Wake: the earliest deadline still ahead."""
    return min((w for w in planned if w is not None and w > d.now), default=None)
