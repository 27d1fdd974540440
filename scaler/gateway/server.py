"""The gRPC `Scaler` service: validates each call and hands it to whoever decides for its function.

In a node that is the controller in the same process (`Controller.call`); in a front gateway, the
`Forwarder`, which sends it over NATS to the node that owns the function. Bad input is refused here
with INVALID_ARGUMENT before anything is stored.

Every field that reaches a command or an event is bounded here, so that no call can make a message
NATS refuses (1 MB by default): with these limits the largest event is about 1.5 kB (an Idle's
reason, which a need_destroy release and retirement both carry), a command under 1 kB, and a
decision's batch holds a few events per command plus one or two per instance it touches.

An Assign may carry in its gRPC metadata a session id, under `scaler-session` (SESSION_KEY): the
request then prefers the instance that served the session before (scaler/controller/core/decide.py); a
state id, under `scaler-state`: it runs on the instance holding that state; its function's tenant,
under `scaler-tenant`, and version, under `scaler-version`. The challenge's protocol has no such
fields, so its callers never send them and nothing changes for them. An Assign its tenant's quota held
back is answered as the challenge's Throttle, with `scaler-status: ReachMaxOnDemandInstancesPerTenant`
in its trailing metadata.
"""

import logging
from collections.abc import Callable
from time import perf_counter
from typing import Protocol

import grpc

from scaler.controller.core.limits import tenant_problem
from scaler.controller.core.operator import MAX_VERSION_BYTES
from scaler.gateway import admin, admin_key, info
from scaler.gateway.owed import Owed
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.commands import QUOTA_STATUS, Assign, Code, Idle, Reply
from scaler.proto.events import Meta
from scaler.proto.info import Info
from scaler.proto.subjects import MAX_INSTANCE_ID_BYTES, key_problem
from scaler.runtime import metrics, reload
from scaler.runtime.bus import Unavailable
from scaler.runtime.ports import bind, grpc_server, is_loopback
from scaler.runtime.storehealth import StoreWatch
from scaler.runtime.tls import ServerTls

log = logging.getLogger("scaler.gateway")

GRPC_CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}
MAX_CALLS = 10_000  # calls in flight at once (an Assign may wait seconds for a cold start); past it RESOURCE_EXHAUSTED
MAX_ID_BYTES = 256  # a request id
MAX_RUNTIME_BYTES = 64
MAX_REASON_BYTES = 1024  # an Idle's reason
MAX_MEMORY_MB = 1 << 20  # 1 TiB
MAX_TIMEOUT_S = 86_400  # a day; 0 is "none given" (the lease then uses the default timeout)
MAX_DURATION_MS = 86_400_000  # a day: no request holds an instance longer than its lease
SESSION_KEY = "scaler-session"  # the gRPC metadata key of an Assign's session id
STATE_KEY = "scaler-state"  # ... of the state it runs on (stateful routes)
TENANT_KEY = "scaler-tenant"  # ... of its function's tenant
VERSION_KEY = "scaler-version"  # ... of its function's version
STATUS_KEY = "scaler-status"  # the trailing metadata key that says why an Assign was throttled, when a quota did
MAX_SESSION_BYTES = 256  # a session's or a state's id
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)  # a call refused so may come again
Call = Assign | Idle  # what the gateway passes on (named here: the servicer's methods shadow the commands)


MARGIN = 0.1  # of a caller's remaining time, kept to answer in: a refusal reaches it before its own deadline
MAX_MARGIN_S = 1.0


def answer_within(remaining_s: float) -> float:
    """How long a call may wait for its answer when its caller waits `remaining_s` more: its deadline less a margin
    (a tenth, a second at most), so that a call that cannot be answered in time is refused DEADLINE_EXCEEDED while
    its caller still listens, rather than racing its deadline."""
    return max(0.0, remaining_s - min(MAX_MARGIN_S, remaining_s * MARGIN))


class Router(Protocol):
    async def call(self, cmd: Call, timeout_s: float | None) -> Reply:
        """The function's answer to the call. Raises Unavailable, or TimeoutError after `timeout_s`; a caller
        that stops waiting (cancellation) is the router's to clean up after."""
        ...


class Throttled(Exception):
    """A cap held the request back: answered with the proto's Throttle status and the reason (`status`: the
    trailing metadata's scaler-status, when its tenant's quota held it)."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_id(name: str, value: str, limit: int = MAX_ID_BYTES) -> None:
    if not value:
        raise _invalid(f"{name} is empty")
    _check_text(name, value, limit)


def _check_text(name: str, value: str, limit: int) -> None:
    if len(value) > limit or len(value.encode()) > limit:  # the first test spares encoding a huge string
        raise _invalid(f"{name} is longer than {limit} bytes")


def _check_number(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise _invalid(f"{name} is {value}, more than {limit}")


def _check_key(key: str) -> None:
    if problem := key_problem(key):
        raise _invalid(problem)


def named(metadata) -> dict[str, str]:
    """What an Assign's metadata names, checked: its session, state, tenant and version (those it names)."""
    given = {key: value for key, value in metadata or () if key in _NAMED}
    said = {_NAMED[key]: value for key, value in given.items()}
    _check_text(SESSION_KEY, said.get("session", ""), MAX_SESSION_BYTES)
    _check_text(STATE_KEY, said.get("state", ""), MAX_SESSION_BYTES)
    _check_text(VERSION_KEY, said.get("version", ""), MAX_VERSION_BYTES)
    if said.get("session") and said.get("state"):
        raise _invalid(f"an Assign names a {SESSION_KEY} or a {STATE_KEY}, not both")
    if (tenant := said.get("tenant")) and (problem := tenant_problem(tenant)):
        raise _invalid(f"{TENANT_KEY}: {problem}")
    return said


_NAMED = {SESSION_KEY: "session", STATE_KEY: "state", TENANT_KEY: "tenant", VERSION_KEY: "version"}


def assign_command(request: pb.AssignRequest, **named: str) -> Assign:
    if not request.HasField("meta_data"):
        raise _invalid("meta_data is missing")
    meta = request.meta_data
    _check_id("request_id", request.request_id)
    _check_key(meta.key)
    if meta.memory_in_mb == 0:
        raise _invalid("meta_data.memory_in_mb must be positive")
    _check_number("meta_data.memory_in_mb", meta.memory_in_mb, MAX_MEMORY_MB)
    _check_number("meta_data.timeout_in_secs", meta.timeout_in_secs, MAX_TIMEOUT_S)
    _check_text("meta_data.runtime", meta.runtime, MAX_RUNTIME_BYTES)
    return Assign(
        key=meta.key,
        request_id=request.request_id,
        meta=Meta(memory_mb=meta.memory_in_mb, runtime=meta.runtime, timeout_s=meta.timeout_in_secs),
        **named,
    )


def idle_command(request: pb.IdleRequest) -> Idle:
    if not request.HasField("assigment"):
        raise _invalid("assigment is missing")
    a = request.assigment
    _check_id("assigment.request_id", a.request_id)
    _check_key(a.meta_key)
    _check_id("assigment.instance_id", a.instance_id, MAX_INSTANCE_ID_BYTES)
    result = request.result
    _check_number("result.duration_in_ms", result.duration_in_ms, MAX_DURATION_MS)
    _check_text("result.reason", result.reason, MAX_REASON_BYTES)
    return Idle(
        key=a.meta_key,
        request_id=a.request_id,
        instance_id=a.instance_id,
        status_code=result.status_code if request.HasField("result") else 200,
        duration_ms=result.duration_in_ms,
        need_destroy=result.need_destroy,
        reason=result.reason,
    )


class Gateway(pb_grpc.ScalerServicer):
    def __init__(
        self,
        router: Router,
        listen: str = "127.0.0.1:9001",
        reply_timeout_s: float = 60.0,
        info: Callable[[], Info] | None = None,
        max_calls: int = MAX_CALLS,
        drain=None,
        tls: ServerTls | None = None,
        admin_token_file: str = "",
    ) -> None:
        self.router = router
        self.tls = tls  # serve TLS (and, with its client CA, only callers with a certificate it signed)
        self.admin_token_file = admin_token_file  # the key Admin calls must carry (scaler/gateway/admin_key.py)
        self.drain = drain  # scaler.Admin/Drain: hand the node's partitions over and stop (scaler/cli/node.py)
        self.info = info  # what it says of itself on scaler.Info, when asked (scaler/gateway/info.py); None: nothing
        self.listen = listen
        self.reply_timeout_s = reply_timeout_s
        self.max_calls = max_calls
        self.port = 0
        self.owed = Owed()  # what a node leaving after a drain still answers (scaler/cli/node.py)
        self.store: StoreWatch | None = None  # the node's: names the cause when the event store refuses writes
        self._server: grpc.aio.Server | None = None

    async def start(self) -> str:
        self._server = grpc_server(self.max_calls)  # memory stays bounded; a burst is not cancelled
        pb_grpc.add_ScalerServicer_to_server(self, self._server)
        if self.info is not None:
            self._server.add_generic_rpc_handlers((info.handler(self.info),))
        serves_admin = isinstance(self.router, admin.Functions)
        if serves_admin:
            key = self.admin_key()
            handler = admin.handler(self.router, self.reply_timeout_s, self.drain, key and reload.watch(key).current)
            self._server.add_generic_rpc_handlers((handler,))
        self.port = bind(self._server, self.listen, self.tls)
        await self._server.start()
        host = self.listen.rsplit(":", 1)[0]
        return f"gateway on {host}:{self.port}{self._says(serves_admin)}"

    def check(self) -> None:
        """Read what it serves with (its certificate and key, the admin key) and refuse an Admin it may not serve:
        a node says either before its controller starts."""
        if self.tls is not None:
            self.tls.check()
        if isinstance(self.router, admin.Functions):
            self.admin_key()

    def admin_key(self) -> reload.Watched[tuple[bytes, ...]] | None:
        """The keys an Admin call must carry one of (made if its file does not exist), read again when its file
        changes; None (any caller) only on a listener this machine alone reaches."""
        if not self.admin_token_file:
            if not is_loopback(self.listen):
                raise admin_key.AdminOpen(
                    f"Admin on {self.listen} would let anyone who reaches it delete functions: give"
                    f" {admin_key.FLAG} PATH (a random key is made there if it does not exist), or listen on 127.0.0.1"
                )
            return None
        path = self.admin_token_file
        admin_key.load(path, make=True)  # made once: a file gone for a moment later is not a reason for another
        return reload.Watched(f"the admin key ({admin_key.FLAG})", [path], lambda: admin_key.keys(path))

    def _says(self, serves_admin: bool) -> str:
        how = []
        if self.tls is not None:
            how.append("mutual TLS" if self.tls.client_ca else "TLS")
        if serves_admin:
            how.append("Admin with a key" if self.admin_token_file else "Admin for this machine only")
        return f" ({', '.join(how)})" if how else ""

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=5)

    async def Assign(self, request: pb.AssignRequest, context: grpc.aio.ServicerContext) -> pb.AssignReply:
        began = perf_counter()
        # Owed from the call on: a node stopping after a drain waits for an Assign under way, then for its Idle.
        self.owed.assigned(request.request_id)
        assigned = False
        try:
            cmd = assign_command(request, **named(context.invocation_metadata()))
            reply = await self._call(cmd, context)
            assigned = True
        except Throttled as e:  # the challenge's own answer for "not now": its Throttle status
            metrics.THROTTLED.labels("tenant_quota" if e.status else "cap").inc()
            if e.status:
                context.set_trailing_metadata(((STATUS_KEY, e.status),))
            return pb.AssignReply(status=pb.Throttle, error_message=str(e))
        except Refused as e:
            await context.abort(e.code, e.message)
        finally:
            metrics.ASSIGN.observe(perf_counter() - began)
            if not assigned:
                self.owed.returned(request.request_id)
        assignment = pb.Assignment(request_id=cmd.request_id, meta_key=cmd.key, instance_id=reply.instance_id)
        return pb.AssignReply(status=pb.Ok, assigment=assignment)

    async def Idle(self, request: pb.IdleRequest, context: grpc.aio.ServicerContext) -> pb.IdleReply:
        began = perf_counter()
        try:
            await self._call(idle_command(request), context)
        except Refused as e:
            if e.code not in RETRIED:  # a final answer: the caller will not send this Idle again
                self.owed.returned(request.assigment.request_id)
            await context.abort(e.code, e.message)
        finally:
            metrics.IDLE.observe(perf_counter() - began)
        self.owed.returned(request.assigment.request_id)
        return pb.IdleReply(status=pb.Ok)

    async def _call(self, cmd: Call, context: grpc.aio.ServicerContext) -> Reply:
        """The router's answer; raise Refused on any failure."""
        remaining = context.time_remaining()
        timeout = self.reply_timeout_s if remaining is None else min(answer_within(remaining), self.reply_timeout_s)
        try:
            reply = await self.router.call(cmd, timeout)
        except Unavailable as e:
            raise Refused(grpc.StatusCode.UNAVAILABLE, self._why(str(e))) from None
        except TimeoutError:
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, self._why(f"no answer within {timeout:g}s")) from None
        if reply.code is Code.THROTTLED:
            raise Throttled(reply.message)
        if reply.code is Code.QUOTA:
            raise Throttled(reply.message, QUOTA_STATUS)
        if reply.code is not Code.OK:
            code = GRPC_CODES.get(reply.code, grpc.StatusCode.UNKNOWN)
            raise Refused(code, self._why(reply.message) if code in RETRIED else reply.message)
        return reply

    def _why(self, message: str) -> str:
        """A refusal for want of the event store says what the store's own health check says of it."""
        said = self.store.describe() if self.store is not None else ""
        return f"{message}; {said}" if said else message
