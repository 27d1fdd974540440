"""`scaler.Admin`: an operator's calls beside the Scaler service, on a function, one of its instances or states,
a tenant, or the nodes.

JSON in and out, as `scaler.Info` (no .proto to share for a few fields). What changes a function
(Restart, Delete, Stop, Set, Create, DeleteState) is a command to its controller like any call:
forwarded to the node that owns the function, decided in its order, stored as events with the
operator's reason, and answered once stored. A function no controller knows is NOT_FOUND. List asks
every running controller for what it holds, Instances the function's owner alone
(scaler/controller/state_service.py). Nodes reads the lease buckets; Tenants and Quota the tenants'
quotas (scaler/controller/tenants.py), which any node sets for all. Drain hands the node's partitions
to the other nodes and stops it (scaler/cli/node.py); the only node refuses unless forced. A gateway
whose router cannot list (a front gateway) serves none of this: UNIMPLEMENTED. Every call carries the
node's key when it has one (scaler/gateway/admin_key.py); a command passed on to the function's owner
goes over NATS, where the permission to publish commands is the boundary (docs/security.md).
"""

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import grpc
import msgspec
from nats.errors import Error as NatsError

from scaler.controller.core.limits import TenantQuota, tenant_problem
from scaler.controller.core.state import FnState, Override, Phase
from scaler.controller.core.totals import Totals
from scaler.gateway import admin_key
from scaler.proto.commands import Admin, Code, Configure, Create, Delete, DeleteState, Reply, Restart, Stop
from scaler.proto.subjects import key_problem
from scaler.runtime import metrics
from scaler.runtime.bus import Unavailable

log = logging.getLogger("scaler.admin")

SERVICE = "scaler.Admin"
MAX_REASON_BYTES = 1024
MAX_NAME_BYTES = 256  # an instance id's or a state's
CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@runtime_checkable
class Functions(Protocol):
    """What a router offers an operator: its commands decided by their function's owner, every function (or
    one, from its owner), the nodes, and the tenants' quotas."""

    async def call(self, cmd: Admin, timeout_s: float | None) -> Reply: ...

    async def functions(self, key: str = "") -> dict[str, FnState]: ...

    async def nodes(self) -> list[Any]: ...

    def quotas(self) -> tuple[dict[str, TenantQuota], Totals]: ...

    async def set_quota(self, tenant: str, quota: TenantQuota | None) -> None: ...


class Precondition(Exception):
    """An Admin call refused for the state things are in (the only node asked to drain): FAILED_PRECONDITION."""


class Ask(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str = ""
    reason: str = ""
    instance: str = ""  # Restart, Stop: one instance
    state: str = ""  # DeleteState
    max_instances: int | None = None  # Set: None leaves it as it is
    max_memory_mb: int | None = None
    min_warm: int | None = None
    exchange_rate: float | None = None
    reset_limits: bool = False
    policy: str | None = None
    version: str | None = None  # Set, Create
    tenant: str = ""  # Quota
    max_on_demand: int | None = None
    max_reserved: int | None = None
    reset: bool = False  # Quota: the limits file's again
    force: bool = False  # Drain: even the only node


class Function(msgspec.Struct, frozen=True, omit_defaults=True):
    """One function as List shows it: its instances' ids by phase, its waiting requests, sessions and states,
    and what was set for it."""

    key: str
    memory_mb: int
    instances: dict[str, list[str]]
    waiting: int
    sessions: int
    states: dict[str, str] = {}  # state -> the instance that holds it
    tenant: str = ""
    version: str = ""
    policy: str = ""
    limits: dict[str, float] = {}  # set while running, over the limits file's
    deleted: str = ""  # why, when it is deleted (a tombstone)


class InstanceStats(msgspec.Struct, frozen=True, omit_defaults=True):
    """One instance as Instances shows it (Pulsar's per-instance stats)."""

    id: str
    phase: str
    since_ms: int  # when it entered its phase
    wanted_ms: int  # when it was asked for
    memory_mb: int
    served: int  # requests it ran to their Idle
    errors: int  # ... answered with a status code of 400 or more
    busy_ms: int  # time it ran them
    runtime: str = ""
    version: str = ""
    slot: str = ""
    request: str = ""  # the one it runs, when busy
    state: str = ""  # the state it holds
    sessions: list[str] = []  # the sessions bound to it
    keep_until_ms: int = 0
    reserved: bool = False
    retires: str = ""  # why it retires once released


class TenantUse(msgspec.Struct, frozen=True):
    """A tenant's quota, and what its functions hold on every node (as this node last heard)."""

    tenant: str
    max_on_demand: int
    max_reserved: int
    on_demand: int
    reserved: int


class Answer(msgspec.Struct, frozen=True, omit_defaults=True):
    message: str = ""
    functions: list[Function] = []
    instances: list[InstanceStats] = []
    nodes: list[Any] = []  # scaler/controller/membership.Member, as JSON
    tenants: list[TenantUse] = []


def listing(states: dict[str, FnState], key: str = "") -> list[Function]:
    shown = [s for k, s in sorted(states.items()) if not key or k == key]
    return [
        Function(
            key=s.key,
            memory_mb=s.meta.memory_mb if s.meta else 0,
            instances={p.value: sorted(i.id for i in s.in_phase(p)) for p in Phase if s.in_phase(p)},
            waiting=len(s.queue),
            sessions=len(s.sessions),
            states={state: route.instance_id for state, route in sorted(s.states.items())},
            tenant=s.tenant,
            version=s.version,
            policy=s.policy,
            limits={k: v for k, v in msgspec.structs.asdict(s.limits).items() if v is not None} if s.limits else {},
            deleted=(s.deleted.reason or "deleted") if s.deleted is not None else "",
        )
        for s in shown
    ]


def instance_stats(s: FnState) -> list[InstanceStats]:
    sessions: dict[str, list[str]] = {}
    for session, b in s.sessions.items():
        sessions.setdefault(b.instance_id, []).append(session)
    return [
        InstanceStats(
            id=i.id,
            phase=i.phase.value,
            since_ms=i.since_ms,
            wanted_ms=i.wanted_ms,
            memory_mb=i.memory_mb,
            served=i.served,
            errors=i.errors,
            busy_ms=i.busy_ms,
            runtime=i.runtime,
            version=i.version,
            slot=i.slot_id,
            request=i.request_id if i.phase is Phase.BUSY else "",
            state=s.holder(i.id),
            sessions=sorted(sessions.get(i.id, [])),
            keep_until_ms=i.keep_until_ms if i.phase is Phase.IDLE else 0,
            reserved=i.reserved,
            retires=i.retire_on_release,
        )
        for i in sorted(s.instances.values(), key=lambda i: (i.wanted_ms, i.id))
    ]


def tenant_uses(quotas: dict[str, TenantQuota], totals: Totals) -> list[TenantUse]:
    names = sorted(quotas.keys() | totals.tenants.keys())
    return [
        TenantUse(
            tenant=t,
            max_on_demand=quotas.get(t, TenantQuota()).max_on_demand,
            max_reserved=quotas.get(t, TenantQuota()).max_reserved,
            on_demand=totals.held(t).on_demand,
            reserved=totals.held(t).reserved,
        )
        for t in names
    ]


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _ask(body: bytes, needs_key: bool) -> Ask:
    try:
        ask = msgspec.json.decode(body or b"{}", type=Ask)
    except msgspec.DecodeError as e:
        raise _invalid(f"not an admin request: {e}") from None
    if (needs_key or ask.key) and (problem := key_problem(ask.key)):
        raise _invalid(problem)
    if len(ask.reason.encode()) > MAX_REASON_BYTES:
        raise _invalid(f"reason is longer than {MAX_REASON_BYTES} bytes")
    for name in ("instance", "state"):
        if len(getattr(ask, name).encode()) > MAX_NAME_BYTES:
            raise _invalid(f"{name} is longer than {MAX_NAME_BYTES} bytes")
    return ask


def _command(method: str, ask: Ask) -> Admin:
    """The command an Admin call asks of the function's owner."""
    asked = dict(key=ask.key, reason=ask.reason, asked_ms=time.time_ns() // 1_000_000)
    match method:
        case "Restart":
            return Restart(**asked, instance_id=ask.instance)
        case "Delete":
            return Delete(**asked)
        case "Stop":
            if not ask.instance:
                raise _invalid("instance is empty")
            return Stop(**asked, instance_id=ask.instance)
        case "DeleteState":
            if not ask.state:
                raise _invalid("state is empty")
            return DeleteState(**asked, state=ask.state)
        case "Create":
            return Create(**asked, version=ask.version or "")
        case _:
            return Configure(
                **asked, **Override.given(ask), reset_limits=ask.reset_limits, policy=ask.policy, version=ask.version
            )


def handler(
    router: Functions,
    timeout_s: float,
    drain: Callable[[bool], Awaitable[str]] | None = None,
    key: Callable[[], tuple[bytes, ...]] | None = None,
) -> grpc.GenericRpcHandler:
    """The Admin service; with `key` (the keys as they are now), a call that does not carry one is refused before
    anything is read."""

    async def guarded(name: str, work, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if key is not None and (refused := admin_key.refusal(key(), context)):
            code, why = refused
            log.warning("refused Admin/%s from %s: %s", name, context.peer(), why)
            metrics.admin_action(name, code.name)
            await context.abort(code, why)
        refused, outcome = None, "UNKNOWN"
        try:
            answer = msgspec.json.encode(await work(body))
            outcome = "OK"
            return answer
        except _Refused as e:
            refused = e
        except Precondition as e:
            refused = _Refused(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Unavailable as e:
            refused = _Refused(grpc.StatusCode.UNAVAILABLE, str(e))
        except TimeoutError as e:  # the owner, or (List) a node holding partitions, did not answer
            refused = _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in time ({e or 'timeout'})")
        except NatsError as e:  # NATS away: a request the client refuses while it reconnects
            refused = _Refused(grpc.StatusCode.UNAVAILABLE, f"NATS is not reachable: {e or type(e).__name__}")
        finally:
            metrics.admin_action(name, refused.code.name if refused is not None else outcome)
        await context.abort(refused.code, str(refused))

    async def list_(body: bytes) -> Answer:
        ask = _ask(body, needs_key=False)
        return Answer(functions=listing(await router.functions(ask.key), ask.key))

    async def instances(body: bytes) -> Answer:
        ask = _ask(body, needs_key=True)
        s = (await router.functions(ask.key)).get(ask.key)
        if s is None or (s.meta is None and not s.instances):
            raise _Refused(grpc.StatusCode.NOT_FOUND, f"no function {ask.key!r}")
        stats = instance_stats(s)
        if ask.instance:
            stats = [i for i in stats if i.id == ask.instance]
            if not stats:
                raise _Refused(grpc.StatusCode.NOT_FOUND, f"no instance {ask.instance!r} of {ask.key!r}")
        return Answer(instances=stats)

    def command(method: str):
        async def run(body: bytes) -> Answer:
            cmd = _command(method, _ask(body, needs_key=True))
            reply = await router.call(cmd, timeout_s)
            if reply.code is not Code.OK:
                raise _Refused(CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message)
            return Answer(message=reply.message)

        return run

    async def nodes(body: bytes) -> Answer:
        _ask(body, needs_key=False)
        return Answer(nodes=await router.nodes())

    async def tenants(body: bytes) -> Answer:
        _ask(body, needs_key=False)
        return Answer(tenants=tenant_uses(*router.quotas()))

    async def quota(body: bytes) -> Answer:
        ask = _ask(body, needs_key=False)
        if problem := tenant_problem(ask.tenant):
            raise _invalid(problem)
        if ask.reset:
            await router.set_quota(ask.tenant, None)
        else:
            was = router.quotas()[0].get(ask.tenant, TenantQuota())
            on_demand = was.max_on_demand if ask.max_on_demand is None else ask.max_on_demand
            reserved = was.max_reserved if ask.max_reserved is None else ask.max_reserved
            if on_demand < 0 or reserved < 0:
                raise _invalid("a quota is 0 (none) or more")
            await router.set_quota(ask.tenant, TenantQuota(max_on_demand=on_demand, max_reserved=reserved))
        q = router.quotas()[0].get(ask.tenant, TenantQuota())
        return Answer(message=f"tenant {ask.tenant}: max_on_demand {q.max_on_demand}, max_reserved {q.max_reserved}")

    async def drain_(body: bytes) -> Answer:
        ask = _ask(body, needs_key=False)
        if drain is None:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "this process does not drain")
        return Answer(message=await drain(ask.force))

    methods = {
        "List": list_,
        "Instances": instances,
        "Nodes": nodes,
        "Tenants": tenants,
        "Quota": quota,
        "Drain": drain_,
        **{name: command(name) for name in ("Restart", "Delete", "Stop", "Set", "Create", "DeleteState")},
    }

    def unary(name: str, work):
        async def method(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await guarded(name, work, body, context)

        return grpc.unary_unary_rpc_method_handler(method)

    return grpc.method_handlers_generic_handler(SERVICE, {name: unary(name, work) for name, work in methods.items()})
