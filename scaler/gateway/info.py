"""`scaler.Info/Get`: what a node says of itself (its speed, its policy), so a simulator checks its setup first.

A method served beside the challenge's Scaler service, on the same port, whose answer is a JSON
object: no .proto to share for three fields, and a scaler without it (the challenge's own, a
front gateway) answers UNIMPLEMENTED, which a caller takes as "it does not say".
"""

import json

import grpc

SERVICE = "scaler.Info"
METHOD = f"/{SERVICE}/Get"


def handler(info: dict) -> grpc.GenericRpcHandler:
    body = json.dumps(info).encode()

    async def get(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return body

    return grpc.method_handlers_generic_handler(SERVICE, {"Get": grpc.unary_unary_rpc_method_handler(get)})
