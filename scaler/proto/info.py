"""`scaler.Info/Get`: what a node says of itself, so that a command given its gRPC address needs nothing else.

A method served beside the challenge's Scaler service, on the same port (scaler/gateway/info.py), whose
answer is a JSON object read when asked: no .proto to share for a few fields. A scaler without it (the
challenge's own, a front gateway) answers UNIMPLEMENTED: it does not say.
"""

import grpc
import msgspec

SERVICE = "scaler.Info"
METHOD = f"/{SERVICE}/Get"


class Info(msgspec.Struct, frozen=True):
    speed: float | None = None  # its clocks' speed: a simulation must run at the same
    policy: str = ""
    instances: int = 0  # held now, in any phase: a simulation needs a scaler that holds none (an earlier run's)
    nats: str = ""  # where its event stream is (`scaler replay`, `scaler simulate --report`), without credentials


class NoAnswer(Exception):
    """No scaler answered at the address; the message says so in a line."""


async def ask(gateway: str, timeout_s: float, channel: grpc.aio.Channel | None = None) -> Info:
    """What the node at `gateway` says of itself; an empty Info when it does not say (another scaler)."""

    async def get(ch: grpc.aio.Channel) -> Info:
        try:
            raw = await ch.unary_unary(METHOD)(b"", timeout=timeout_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return Info()
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise NoAnswer(f"no scaler answers at {gateway} (waited {timeout_s:g}s)") from None
            raise NoAnswer(f"the scaler at {gateway} answered {e.code().name}: {e.details()}") from None
        try:
            return msgspec.json.decode(raw, type=Info)
        except msgspec.DecodeError:
            return Info()

    if channel is not None:
        return await get(channel)
    async with grpc.aio.insecure_channel(gateway) as ch:
        return await get(ch)
