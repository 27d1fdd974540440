"""`scaler.Admin`: an operator's calls beside the Scaler service: list functions, restart or delete one.

JSON in and out, as `scaler.Info` (no .proto to share for a few fields). Restart and Delete are
commands to the function's controller like any call: forwarded to the node that owns the function,
decided in its order, stored as events with the operator's reason, and answered once stored. A
function no controller knows is NOT_FOUND. List asks every running controller for what it holds
(scaler/controller/state_service.py). Drain hands the node's partitions to the other nodes and stops it
(scaler/cli/node.py). A gateway whose router cannot list (a front gateway) serves none of this:
UNIMPLEMENTED. Every call carries the node's key when it has one (scaler/gateway/admin_key.py); a
restart or delete passed on to the function's owner goes over NATS, where the permission to publish
commands is the boundary (docs/security.md).
"""

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import grpc
import msgspec

from scaler.controller.core.state import FnState, Phase
from scaler.gateway import admin_key
from scaler.proto.commands import Code, Delete, Reply, Restart
from scaler.proto.subjects import key_problem
from scaler.runtime.bus import Unavailable

log = logging.getLogger("scaler.admin")

SERVICE = "scaler.Admin"
MAX_REASON_BYTES = 1024
CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@runtime_checkable
class Functions(Protocol):
    """What a router offers an operator: its commands decided by their function's owner, and every function."""

    async def call(self, cmd: Restart | Delete, timeout_s: float | None) -> Reply: ...

    async def functions(self) -> dict[str, FnState]: ...


class Ask(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str = ""
    reason: str = ""


class Function(msgspec.Struct, frozen=True):
    """One function as List shows it: its instances' ids by phase, its waiting requests and sessions."""

    key: str
    memory_mb: int
    instances: dict[str, list[str]]
    waiting: int
    sessions: int


class Answer(msgspec.Struct, frozen=True, omit_defaults=True):
    message: str = ""
    functions: list[Function] = []


def listing(states: dict[str, FnState], key: str = "") -> list[Function]:
    shown = [s for k, s in sorted(states.items()) if not key or k == key]
    return [
        Function(
            key=s.key,
            memory_mb=s.meta.memory_mb if s.meta else 0,
            instances={p.value: sorted(i.id for i in s.in_phase(p)) for p in Phase if s.in_phase(p)},
            waiting=len(s.queue),
            sessions=len(s.sessions),
        )
        for s in shown
    ]


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _ask(body: bytes, needs_key: bool) -> Ask:
    try:
        ask = msgspec.json.decode(body or b"{}", type=Ask)
    except msgspec.DecodeError as e:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"not an admin request: {e}") from None
    if (needs_key or ask.key) and (problem := key_problem(ask.key)):
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, problem)
    if len(ask.reason.encode()) > MAX_REASON_BYTES:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"reason is longer than {MAX_REASON_BYTES} bytes")
    return ask


def handler(
    router: Functions,
    timeout_s: float,
    drain: Callable[[], Awaitable[str]] | None = None,
    key: bytes | None = None,
) -> grpc.GenericRpcHandler:
    """The Admin service; with `key`, a call that does not carry it is refused before anything is read."""

    async def guarded(name: str, work, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if key is not None and (refused := admin_key.refusal(key, context)):
            code, why = refused
            log.warning("refused Admin/%s from %s: %s", name, context.peer(), why)
            await context.abort(code, why)
        try:
            return msgspec.json.encode(await work(body))
        except _Refused as e:
            await context.abort(e.code, str(e))
        except Unavailable as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except TimeoutError as e:  # the owner, or (List) a node holding partitions, did not answer
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in time ({e or 'timeout'})")

    async def list_(body: bytes) -> Answer:
        ask = _ask(body, needs_key=False)
        return Answer(functions=listing(await router.functions(), ask.key))

    def command(kind: type[Restart | Delete]):
        async def run(body: bytes) -> Answer:
            ask = _ask(body, needs_key=True)
            cmd = kind(key=ask.key, reason=ask.reason, asked_ms=time.time_ns() // 1_000_000)
            reply = await router.call(cmd, timeout_s)
            if reply.code is not Code.OK:
                raise _Refused(CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message)
            return Answer(message=reply.message)

        return run

    async def drain_(body: bytes) -> Answer:
        if drain is None:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "this process does not drain")
        return Answer(message=await drain())

    methods = {"List": list_, "Restart": command(Restart), "Delete": command(Delete), "Drain": drain_}

    def unary(name: str, work):
        async def method(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await guarded(name, work, body, context)

        return grpc.unary_unary_rpc_method_handler(method)

    return grpc.method_handlers_generic_handler(SERVICE, {name: unary(name, work) for name, work in methods.items()})
