"""Events: what happened to a function, appended by its partition's controller alone (subjects: proto.subjects).

One JetStream message holds one `Batch`: every event a decision produced (or a few decisions of one
function, decided in a row: `Batch.steps`), so a decision is appended atomically or not at all.
Rules that keep old streams readable:
- a tag string is never renamed or reused; a breaking change gets a new tag or an upcast below;
- a field added later has a default; a field's type never changes;
- decoding never forbids unknown fields.
"""

from collections.abc import Callable
from typing import Any

import msgspec

from scaler.proto.subjects import effects_token

SCHEMA_VERSION = 1


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    """What the platform tells us about a function in each Assign."""

    memory_mb: int
    runtime: str = ""
    timeout_s: int = 0


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    at_ms: int


class FunctionSeen(Event, tag="function-seen"):
    """First Assign of a function, or its meta changed (a redeploy with other memory)."""

    meta: Meta


class RequestArrived(Event, tag="request-arrived"):
    """An Assign joined the function's queue; `reply_to` is where its answer goes."""

    request_id: str
    reply_to: str = ""
    session: str = ""  # the caller's session (gRPC metadata `scaler-session`): it prefers its bound instance
    state: str = ""  # the state it names (gRPC metadata `scaler-state`): it runs on the instance holding it


class RequestRetried(Event, tag="request-retried"):
    """The same request asked again while queued: this caller waits for the answer too."""

    request_id: str
    reply_to: str


class WaiterLeft(Event, tag="waiter-left"):
    """One caller of a queued request gave up; others still wait for it."""

    request_id: str
    reply_to: str


class RequestWaiting(Event, tag="request-waiting"):
    """The policy let a queued request wait for an instance about to free up instead of starting one."""

    request_id: str
    expected_ms: int = 0  # when the policy expects it to be served
    why: str = ""


class SlotWanted(Event, tag="slot-wanted"):
    """Start an instance: the platform worker calls CreateSlot then Init."""

    instance_id: str
    meta: Meta
    for_request: str = ""  # the request whose miss caused it; empty for a pre-warm
    reason: str = ""
    version: str = ""  # the function's version it runs (FnState.version when it was wanted)
    reserved: bool = False  # started to keep the function's reserved instances (min_warm), not on demand


class InstanceCreated(Event, tag="instance-created"):
    """CreateSlot answered for an instance still being created: stored as its Init goes out and before the
    start's outcome is reported, so a worker that dies during Init leaves a slot the state knows (the next
    attempt continues from it), and no instance serves on a slot it does not."""

    instance_id: str
    slot_id: str
    create_ms: int = 0


class InstanceReady(Event, tag="instance-ready"):
    instance_id: str
    slot_id: str
    create_ms: int = 0
    init_ms: int = 0


class Assigned(Event, tag="assigned"):
    request_id: str
    instance_id: str


class Released(Event, tag="released"):
    """The request is done with the instance (its Idle, or its caller gave up)."""

    request_id: str
    instance_id: str
    status_code: int = 200
    duration_ms: int = 0
    reason: str = ""
    need_destroy: bool = False  # the instance dies with this release (it is retired next)
    cancelled: bool = False  # its caller gave up before the answer reached it: the request was not served


class KeptAlive(Event, tag="kept-alive"):
    """The policy's keep-alive decision for an instance that just became idle."""

    instance_id: str
    until_ms: int
    why: str = ""


class RequestFailed(Event, tag="request-failed"):
    request_id: str
    message: str


class RequestCancelled(Event, tag="request-cancelled"):
    request_id: str
    reason: str = ""


class InstanceRetired(Event, tag="instance-retired"):
    """The instance serves no more; the gc worker destroys its slot when it has one."""

    instance_id: str
    slot_id: str = ""
    reason: str = ""


class InstanceDestroyed(Event, tag="instance-destroyed"):
    """The instance is gone: the platform confirmed DestroySlot, or (with a reason) reconcile found its slot missing."""

    instance_id: str
    slot_id: str = ""
    reason: str = ""


class SessionBound(Event, tag="session-bound"):
    """A session's request took an instance other than the one the session was bound to (or it had none):
    the session's next requests prefer this one."""

    session: str
    instance_id: str
    request_id: str = ""
    why: str = ""


class SessionEnded(Event, tag="session-ended"):
    """A session's binding is gone: it was idle too long, or its instance went."""

    session: str
    reason: str = ""


class FunctionRestarted(Event, tag="function-restarted"):
    """An operator restarted the function's instances: idle ones retire now (their own events), busy ones as
    they are released; instances still being created are left to start."""

    reason: str = ""


class FunctionDeleted(Event, tag="function-deleted"):
    """An operator deleted the function: its instances are retired (their own events, before this one) and
    its state is forgotten but for the slots still being destroyed and a tombstone: its Assigns are refused
    (NOT_FOUND) until it is created again (FunctionCreated)."""

    reason: str = ""


class InstanceToRetire(Event, tag="instance-to-retire"):
    """An operator stopped or restarted one busy instance, or deleted the state it holds: it retires once
    released, never mid-request."""

    instance_id: str
    reason: str = ""


class StateBound(Event, tag="state-bound"):
    """A state's request took an instance: the state's requests run there until the state is deleted (or the
    instance goes: the state's next request binds it anew)."""

    state: str
    instance_id: str
    request_id: str = ""
    why: str = ""


class StateDeleted(Event, tag="state-deleted"):
    """An operator deleted a state: its route goes, and the instance holding it retires (now, or once released)."""

    state: str
    reason: str = ""


class LimitsSet(Event, tag="limits-set"):
    """An operator set the function's limits while it runs, over the limits file's (None: as the file says)."""

    max_instances: int | None = None
    max_memory_mb: int | None = None
    min_warm: int | None = None
    exchange_rate: float | None = None  # slot GB·s a second of its waiting is worth (learned's)
    reason: str = ""


class PolicySet(Event, tag="policy-set"):
    """The policy that decides the function from now on ("": the node's, or the limits file's)."""

    policy: str
    reason: str = ""


class VersionSet(Event, tag="version-set"):
    """The function's version changed: instances of another version retire as they become idle."""

    version: str
    reason: str = ""


class TenantSet(Event, tag="tenant-set"):
    """The tenant the function belongs to: its instances count against that tenant's quotas."""

    tenant: str
    reason: str = ""


class FunctionCreated(Event, tag="function-created"):
    """A deleted function is created again (an operator's call, or an Assign naming a new version): its tombstone
    goes, and it serves calls again."""

    version: str = ""
    reason: str = ""


class Lead(msgspec.Struct, frozen=True, array_like=True):
    """Another function that came back from a lull shortly before this one did, and how long before."""

    key: str
    lag_ms: int


class Followed(Event, tag="followed"):
    """The function came back from a lull within a second of these functions' coming back: how a function
    another one calls is learned (a later return of a leader pre-warms it)."""

    leads: tuple[Lead, ...]


class Cued(Event, tag="cued"):
    """A function this one follows came back while this one had no instance: a trial of that lead, which
    the function's next arrival, within a second or not, decides."""

    leader: str


class StartsHeld(Event, tag="starts-held"):
    """The platform worker refused a start of the function without calling the platform, its circuit open after
    failed starts in a row (scaler/workers/circuit.py): the function starts nothing new before `until_ms`, when
    the circuit lets a start through again."""

    until_ms: int
    reason: str = ""


class ClockRebased(Event, tag="clock-rebased"):
    """A node that loaded the function found its times on another clock (the node that wrote them was
    `shift_ms` behind this one, or ahead when negative): every time its state holds is moved by `shift_ms`,
    so that an elapsed time (a request's lease, a keep-alive, a rest) is the same on this node's clock."""

    shift_ms: int


class FunctionRested(Event, tag="function-rested"):
    """The function has had nothing in flight a while: what only a retry could still need is dropped."""


class FunctionForgotten(Event, tag="function-forgotten"):
    """The function has been idle so long it is forgotten: its state goes, and its next call starts afresh."""


AnyEvent = (
    FunctionSeen
    | RequestArrived
    | RequestRetried
    | WaiterLeft
    | RequestWaiting
    | SlotWanted
    | InstanceCreated
    | InstanceReady
    | Assigned
    | Released
    | KeptAlive
    | RequestFailed
    | RequestCancelled
    | InstanceRetired
    | InstanceDestroyed
    | FunctionRested
    | FunctionForgotten
    | SessionBound
    | SessionEnded
    | FunctionRestarted
    | FunctionDeleted
    | Followed
    | Cued
    | InstanceToRetire
    | StateBound
    | StateDeleted
    | LimitsSet
    | PolicySet
    | VersionSet
    | TenantSet
    | FunctionCreated
    | StartsHeld
    | ClockRebased
)


def creates(e: Event) -> bool:
    """The platform worker acts on this event: it starts an instance."""
    return isinstance(e, SlotWanted)


def destroys(e: Event) -> bool:
    """The gc worker acts on this event: a slot to destroy."""
    return isinstance(e, InstanceRetired) and bool(e.slot_id)


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """One of several decisions a batch holds: its cause, when, how many of the batch's events, its deadline."""

    cause: str
    at_ms: int
    events: int  # the batch's events that follow the previous step's
    wake_ms: int | None = None


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """One function's events, appended as one message: one decision's, or several decided in a row (`steps`).

    Several when commands of the function arrived while its previous append was in flight (group
    commit): they were decided in arrival order, each on the state the one before left, and stored
    together. `cause`, `at_ms` and `wake_ms` are then the first's cause and time and the last's deadline.
    """

    key: str
    at_ms: int
    cause: str  # id of the command that caused the decision
    events: list[AnyEvent]
    wake_ms: int | None = None  # the function's next deadline after this batch: when a Tick is due
    v: int = SCHEMA_VERSION
    steps: list[Step] = []  # the decisions, in order, when it holds several; empty when one

    @property
    def effects(self) -> str:
        """The `<effects>` token of the subject it is appended on: which workers it concerns."""
        return effects_token(any(map(creates, self.events)), any(map(destroys, self.events)))

    def decisions(self) -> list["Batch"]:
        """Each decision it holds, as a batch of its own (itself when it holds one)."""
        if not self.steps:
            return [self]
        out, at = [], 0
        for step in self.steps:
            events = self.events[at : at + step.events]
            at += step.events
            out.append(Batch(key=self.key, at_ms=step.at_ms, cause=step.cause, events=events, wake_ms=step.wake_ms))
        return out


def join(batches: list[Batch]) -> Batch:
    """Decisions of one function, in order, as one batch (one message, one ack)."""
    if len(batches) == 1:
        return batches[0]
    first, last = batches[0], batches[-1]
    steps = [Step(cause=b.cause, at_ms=b.at_ms, events=len(b.events), wake_ms=b.wake_ms) for b in batches]
    events = [e for b in batches for e in b.events]
    return Batch(key=first.key, at_ms=first.at_ms, cause=first.cause, events=events, wake_ms=last.wake_ms, steps=steps)


class SchemaError(ValueError):
    """A stored batch this version cannot read."""


# Upcasts from version N to N+1, applied to the raw decoded batch: `UPCASTS[N](raw) -> raw`.
UPCASTS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Batch)
_raw_decoder = msgspec.msgpack.Decoder()


def encode_batch(batch: Batch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(data: bytes) -> Batch:
    try:
        batch = _decoder.decode(data)
        if batch.v == SCHEMA_VERSION:
            return batch
    except msgspec.ValidationError:
        pass
    return _upcast(_raw_decoder.decode(data))


def _upcast(raw: Any) -> Batch:
    if not isinstance(raw, dict):
        raise SchemaError("not an event batch")
    v = raw.get("v", SCHEMA_VERSION)
    if v > SCHEMA_VERSION:
        raise SchemaError(f"batch has schema v{v}; this scaler reads up to v{SCHEMA_VERSION}")
    while v < SCHEMA_VERSION:
        raw = UPCASTS[v](raw)
        v += 1
        raw["v"] = v
    try:
        return msgspec.convert(raw, Batch)
    except msgspec.ValidationError as e:
        raise SchemaError(f"unreadable event batch: {e}") from e
