"""`scaler.Info/Get` served (scaler/proto/info.py): a node's speed, policy, instances held and NATS, read when asked."""

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import grpc
import msgspec

from scaler.proto.info import SERVICE, Info


def handler(info: Callable[[], Info]) -> grpc.GenericRpcHandler:
    async def get(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return msgspec.json.encode(info())

    return grpc.method_handlers_generic_handler(SERVICE, {"Get": grpc.unary_unary_rpc_method_handler(get)})


def without_credentials(url: str) -> str:
    """A NATS URL (or a comma-separated list of them) as anyone may be told it: no user, password or token."""

    def bare(one: str) -> str:
        parts = urlsplit(one.strip())
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))

    return ",".join(bare(one) for one in url.split(","))
