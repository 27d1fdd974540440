"""The gRPC `Scaler` service: each call becomes a command on JetStream, answered by the controller.

Stateless apart from the calls in flight: several gateways may run side by side. Bad input is
refused here with INVALID_ARGUMENT before it reaches the stream.
"""

import asyncio
import itertools
import logging

import grpc
from msgspec.structs import replace
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from proto import serverless_sim_pb2 as pb
from proto import serverless_sim_pb2_grpc as pb_grpc
from proto.commands import AnyCommand, Assign, Cancel, Code, Idle, Reply, command_id, decode_reply, encode
from proto.events import Meta
from proto.subjects import command_subject, key_problem
from runtime.bus import close, connect, ensure_streams, publish_command

log = logging.getLogger("scaler.gateway")

GRPC_CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}
MAX_ID_BYTES = 256
CANCEL_PATIENCE_S = 120.0  # how long a Cancel is retried through a NATS outage


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check_id(name: str, value: str) -> None:
    if not value:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is empty")
    if len(value.encode()) > MAX_ID_BYTES:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{name} is longer than {MAX_ID_BYTES} bytes")


def _check_key(key: str) -> None:
    if problem := key_problem(key):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, problem)


def assign_command(request: pb.AssignRequest) -> Assign:
    if not request.HasField("meta_data"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "meta_data is missing")
    meta = request.meta_data
    _check_id("request_id", request.request_id)
    _check_key(meta.key)
    if meta.memory_in_mb == 0:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "meta_data.memory_in_mb must be positive")
    return Assign(
        key=meta.key,
        request_id=request.request_id,
        meta=Meta(memory_mb=meta.memory_in_mb, runtime=meta.runtime, timeout_s=meta.timeout_in_secs),
    )


def idle_command(request: pb.IdleRequest) -> Idle:
    if not request.HasField("assigment"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "assigment is missing")
    a = request.assigment
    _check_id("assigment.request_id", a.request_id)
    _check_key(a.meta_key)
    _check_id("assigment.instance_id", a.instance_id)
    result = request.result
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
    def __init__(self, nats_url: str, listen: str = "0.0.0.0:9001", reply_timeout_s: float = 60.0) -> None:
        self.nats_url = nats_url
        self.listen = listen
        self.reply_timeout_s = reply_timeout_s
        self.port = 0
        self._waiters: dict[str, asyncio.Future[Reply]] = {}
        self._cancels: set[asyncio.Task] = set()
        self._tokens = itertools.count()
        self._inbox = ""
        self._nc = None
        self._js = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> str:
        self._nc = await connect(self.nats_url, "gateway")
        self._js = self._nc.jetstream()
        await ensure_streams(self._js)
        self._inbox = self._nc.new_inbox()
        await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
        self._server = grpc.aio.server()
        pb_grpc.add_ScalerServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(self.listen)
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {self.listen}")
        await self._server.start()
        host = self.listen.rsplit(":", 1)[0]
        return f"gateway on {host}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=5)
        if self._cancels:
            await asyncio.wait(self._cancels, timeout=5)
        await close(self._nc)

    async def Assign(self, request: pb.AssignRequest, context: grpc.aio.ServicerContext) -> pb.AssignReply:
        try:
            cmd = assign_command(request)
            reply = await self._call(cmd, context)
        except Refused as e:
            await context.abort(e.code, e.message)
        assignment = pb.Assignment(request_id=cmd.request_id, meta_key=cmd.key, instance_id=reply.instance_id)
        return pb.AssignReply(status=pb.Ok, assigment=assignment)

    async def Idle(self, request: pb.IdleRequest, context: grpc.aio.ServicerContext) -> pb.IdleReply:
        try:
            await self._call(idle_command(request), context)
        except Refused as e:
            await context.abort(e.code, e.message)
        return pb.IdleReply(status=pb.Ok)

    async def _call(self, cmd: AnyCommand, context: grpc.aio.ServicerContext) -> Reply:
        """Publish the command and wait for the controller's reply; raise Refused on any failure."""
        to = f"{self._inbox}.{next(self._tokens)}"
        cmd = replace(cmd, reply_to=to)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[to] = waiter
        remaining = context.time_remaining()
        timeout = self.reply_timeout_s if remaining is None else min(remaining, self.reply_timeout_s)
        try:
            await self._publish(cmd, retry_of_duplicate=True)
            reply = await asyncio.wait_for(waiter, timeout)
        except NatsError as e:  # before TimeoutError: nats-py's timeouts are TimeoutErrors too
            await self._cancel(cmd, "event store unavailable")  # in case the command was stored after all
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"event store unavailable: {e!r}") from None
        except TimeoutError:
            await self._cancel(cmd, "no answer in time")
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:g}s") from None
        except asyncio.CancelledError:  # the caller went away
            await asyncio.shield(self._cancel(cmd, "caller disconnected"))
            raise
        finally:
            self._waiters.pop(to, None)
        if reply.code is not Code.OK:
            raise Refused(GRPC_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message)
        return reply

    async def _publish(self, cmd: AnyCommand, retry_of_duplicate: bool = False) -> None:
        """Publish with the command's id as Nats-Msg-Id, so a retried publish is dropped by JetStream.

        If JetStream reports a duplicate, the same request was sent before (a client retry): send
        it once more under a fresh id, so the controller answers this caller from its state.
        """
        msg_id = command_id(cmd)
        ack = await self._js.publish(command_subject(cmd.key), encode(cmd), headers={"Nats-Msg-Id": msg_id})
        if ack.duplicate and retry_of_duplicate:
            headers = {"Nats-Msg-Id": f"{msg_id}#{cmd.reply_to}"}
            await self._js.publish(command_subject(cmd.key), encode(cmd), headers=headers)

    async def _cancel(self, cmd: AnyCommand, why: str) -> None:
        """Tell the controller this caller gave up, in the background and through a NATS outage.

        The Assign may have been stored even though its publish failed: without the Cancel, the
        request would get an instance and hold it forever. The caller gets its error at once.
        """
        if not isinstance(cmd, Assign):
            return
        cancel = Cancel(key=cmd.key, request_id=cmd.request_id, reply_to=cmd.reply_to, reason=why)
        task = asyncio.create_task(self._send_cancel(cancel))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _send_cancel(self, cancel: Cancel) -> None:
        try:
            await publish_command(self._js, cancel, patience_s=CANCEL_PATIENCE_S)
        except NatsError as e:
            log.warning("could not cancel %s: %s", cancel.request_id, e)

    async def _on_reply(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject)
        if waiter is not None and not waiter.done():
            waiter.set_result(decode_reply(msg.data))
