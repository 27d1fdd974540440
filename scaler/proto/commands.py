"""Commands: what a function's controller is asked to handle, and its answers.

The gateway passes on the platform's calls (Assign, Idle, Cancel); the workers report what the
platform did (SlotCreated, SlotReady, SlotFailed, SlotDestroyed, Reconcile); the controller's own timers
say when a deadline is due (Tick). In the node they are method calls; across processes, core NATS
requests on `cmd.<partition>`, the workers' reports on `report.<partition>` (proto.subjects). Every
command is answered with a `Reply` once its batch is stored: an Assign or Idle with its outcome, any
other with an acknowledgement.
"""

import enum

import msgspec

from scaler.proto.events import Meta


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    key: str  # the metaKey


class Assign(Command, tag="assign"):
    request_id: str
    meta: Meta
    reply_to: str = ""
    session: str = ""  # a session id: the request prefers the instance that served the session before
    state: str = ""  # a state id: the request runs on the instance that holds the state (stateful routes)
    tenant: str = ""  # the tenant the caller names (the limits file's, when it names one, wins)
    version: str = ""  # the function's version the caller names: a new one retires the old instances


class Idle(Command, tag="idle"):
    request_id: str
    instance_id: str
    status_code: int = 200
    duration_ms: int = 0
    need_destroy: bool = False
    reason: str = ""
    reply_to: str = ""


class Cancel(Command, tag="cancel"):
    """The caller of an Assign gave up (deadline or disconnect): free what it holds or waits for."""

    request_id: str
    reply_to: str = ""  # which waiter gave up: a newer retry of the same request is left alone
    reason: str = ""


class SlotCreated(Command, tag="slot-created"):
    """CreateSlot answered; the worker sends Init beside it, reports the start's outcome only once this is
    stored, and drops that Init when the answer is not OK (the instance is no longer wanted: the slot is
    retired instead)."""

    instance_id: str
    slot_id: str
    create_ms: int = 0
    reply_to: str = ""


class SlotReady(Command, tag="slot-ready"):
    instance_id: str
    slot_id: str
    create_ms: int = 0
    init_ms: int = 0


class SlotFailed(Command, tag="slot-failed"):
    instance_id: str
    reason: str
    slot_id: str = ""  # set when CreateSlot succeeded and Init failed: that slot must be destroyed
    # > 0: the platform worker's circuit is open after failures in a row (scaler/workers/circuit.py): this start
    # was refused without calling the platform, or its failure opened the circuit; the next start of this function
    # is tried no sooner than this
    retry_after_ms: int = 0


class SlotDestroyed(Command, tag="slot-destroyed"):
    instance_id: str
    slot_id: str = ""


class Tick(Command, tag="tick"):
    """A deadline of this function is due (keep-alive expiry, planned pre-warm)."""

    due_ms: int


class Cue(Command, tag="cue"):
    """A function this one follows (`leader`) came back from a lull at `at_ms`: it may be called soon."""

    leader: str
    at_ms: int


class Restart(Command, tag="restart"):
    """An operator's: retire the function's instances, idle ones now and busy ones when released; with
    `instance_id`, that instance alone, and another one started in its place."""

    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0  # when the operator asked (tells two restarts apart)
    instance_id: str = ""


class Delete(Command, tag="delete"):
    """An operator's: destroy the function's instances and forget it; a later Assign starts afresh."""

    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0


class Stop(Command, tag="stop"):
    """An operator's: retire one instance, now when idle, once released when busy; none starts in its place."""

    instance_id: str
    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0


class Configure(Command, tag="configure"):
    """An operator's: change a function's limits, policy or version while it runs (None: leave it as it is).

    The limits go over the limits file's; `reset_limits` drops them (the file's again) before those given."""

    max_instances: int | None = None
    max_memory_mb: int | None = None
    min_warm: int | None = None
    exchange_rate: float | None = None  # slot GB·s a second of its waiting is worth (learned's)
    reset_limits: bool = False
    policy: str | None = None  # "": the node's (or the limits file's) policy again
    version: str | None = None
    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0


class Create(Command, tag="create"):
    """An operator's: create a deleted function again (its tombstone goes), at `version` if given."""

    version: str = ""
    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0


class DeleteState(Command, tag="delete-state"):
    """An operator's: delete a state, its route and the instance that holds it (openYuanRong's GetAndDeleteState)."""

    state: str
    reason: str = ""
    reply_to: str = ""
    asked_ms: int = 0


class PlatformSlot(msgspec.Struct, frozen=True, kw_only=True):
    """A live slot as the platform lists it (PlatformAdmin.ListSlots)."""

    id: str
    instance_id: str = ""  # empty until Init reached the slot
    memory_mb: int = 0
    created_ms: int = 0


class Reconcile(Command, tag="reconcile"):
    """The platform's live slots, listed at `listed_ms`: what the state has and the platform lacks is gone,
    what the platform has and no state knows is destroyed. Sent by the gc worker on start to each
    partition, with the slots whose instances belong to it (`owner`); the controller asks each of
    the partition's functions in turn (`key` is then that function)."""

    listed_ms: int
    slots: tuple[PlatformSlot, ...] = ()
    grace_ms: int = 0  # slots and instances younger than this may be in flight: left alone
    partition: int = -1  # the partition whose functions to reconcile, each in turn (-1: just `key`)


def owner(slot: PlatformSlot) -> str:
    """The function whose instance a slot runs, from the instance id (`<key>-<n>`); "" when unknown."""
    key, dash, n = slot.instance_id.rpartition("-")
    return key if dash and n.isdigit() else ""


AnyCommand = (
    Assign
    | Idle
    | Cancel
    | SlotCreated
    | SlotReady
    | SlotFailed
    | SlotDestroyed
    | Tick
    | Cue
    | Reconcile
    | Restart
    | Delete
    | Stop
    | Configure
    | Create
    | DeleteState
)
Admin = Restart | Delete | Stop | Configure | Create | DeleteState  # an operator's commands, answered once stored
Report = SlotCreated | SlotReady | SlotFailed | SlotDestroyed | Reconcile  # what a worker sends, on report.<partition>
OPERATOR = (Restart, Delete, Stop, Configure, Create, DeleteState)  # the same, for isinstance


def command_id(cmd: AnyCommand) -> str:
    """A stable id per logical command: the Nats-Msg-Id that makes a retried publish a no-op."""
    match cmd:
        case Assign(request_id=r):
            return f"assign:{r}"
        case Idle(request_id=r):
            return f"idle:{r}"
        case Cancel(request_id=r, reply_to=to):
            return f"cancel:{r}:{to}"
        case SlotCreated(instance_id=i, slot_id=slot):
            return f"created:{i}:{slot}"
        case SlotReady(instance_id=i):
            return f"ready:{i}"
        case SlotFailed(instance_id=i):
            return f"failed:{i}"
        case SlotDestroyed(instance_id=i):
            return f"destroyed:{i}"
        case Tick(key=k, due_ms=t):
            return f"tick:{k}:{t}"
        case Cue(key=k, leader=leader, at_ms=t):
            return f"cue:{k}:{leader}:{t}"
        case Reconcile(listed_ms=t):
            return f"reconcile:{t}"
        case Restart(key=k, asked_ms=t, instance_id=i):
            return f"restart:{k}:{t}" + (f":{i}" if i else "")
        case Delete(key=k, asked_ms=t):
            return f"delete:{k}:{t}"
        case Stop(key=k, asked_ms=t, instance_id=i):
            return f"stop:{k}:{t}:{i}"
        case Configure(key=k, asked_ms=t):
            return f"configure:{k}:{t}"
        case Create(key=k, asked_ms=t):
            return f"create:{k}:{t}"
        case DeleteState(key=k, asked_ms=t, state=state):
            return f"delete-state:{k}:{t}:{state}"
    raise TypeError(f"not a command: {cmd!r}")


class Code(enum.IntEnum):
    """Outcome of a command, mapped by the gateway to a gRPC status code."""

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8  # the node is overloaded: try again shortly
    THROTTLED = 100  # a cap held the request back past its time: the proto's Throttle status (gRPC OK)
    QUOTA = 101  # its tenant's quota held it back past its time: Throttle, marked ReachMaxOnDemandInstancesPerTenant
    FAILED_PRECONDITION = 9
    INTERNAL = 13
    UNAVAILABLE = 14


QUOTA_STATUS = "ReachMaxOnDemandInstancesPerTenant"  # openYuanRong's status for Code.QUOTA, said to the caller


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    to: str  # the reply subject
    request_id: str
    code: Code = Code.OK
    instance_id: str = ""
    message: str = ""


_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(AnyCommand)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_report_decoder = msgspec.msgpack.Decoder(Report)


def encode(msg: AnyCommand | Reply) -> bytes:
    return _encoder.encode(msg)


def decode_command(data: bytes) -> AnyCommand:
    return _command_decoder.decode(data)


class NotAReport(ValueError):
    """A command other than a report on a workers' subject: what a worker may send, NATS says; what it sent, this."""


def decode_report(data: bytes) -> Report:
    """A worker's report; NotAReport when `data` is another command (msgspec's error when it is none at all)."""
    try:
        return _report_decoder.decode(data)
    except msgspec.ValidationError:
        cmd = decode_command(data)
        raise NotAReport(f"a {type(cmd).__name__} is not a report: the workers' subjects carry nothing else") from None


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)
