"""Ports drawn for processes to bind later, and the gRPC servers bound on them."""

import asyncio
from collections import Counter

import grpc

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.ports import bind, free_port, grpc_server


def test_ports_drawn_before_any_is_bound_are_all_different():
    """A cluster's servers, compose's services: each gets its port before any binds one. Drawn at random from
    12,000, 300 of them would meet by chance (the stub and a node's metrics once did, and the node could not
    listen)."""
    drawn = [free_port() for _ in range(300)]
    assert len(set(drawn)) == len(drawn)


async def test_a_server_refuses_the_calls_past_its_limit_and_cancels_none():
    """Calls past `max_calls` are told RESOURCE_EXHAUSTED (try again later), none CANCELLED: with the calls gRPC's
    core may hold unread capped at `max_calls` too, it cancelled most of those past it (33 of 40)."""
    limit, past = 4, 40
    entered, release = asyncio.Semaphore(0), asyncio.Event()

    class Held(pb_grpc.ScalerServicer):
        async def Assign(self, request, context):
            entered.release()
            await release.wait()
            return pb.AssignReply(status=pb.Ok)

    server = grpc_server(limit)
    pb_grpc.add_ScalerServicer_to_server(Held(), server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            scaler = pb_grpc.ScalerStub(channel)

            async def call(n: int) -> str:
                try:
                    await scaler.Assign(pb.AssignRequest(request_id=f"r{n}"), timeout=60)
                except grpc.aio.AioRpcError as e:
                    return e.code().name
                return "OK"

            held = [asyncio.ensure_future(call(n)) for n in range(limit)]
            for _ in range(limit):
                await asyncio.wait_for(entered.acquire(), 30)
            refused = Counter(await asyncio.gather(*(call(limit + n) for n in range(past))))
            release.set()
            served = Counter(await asyncio.gather(*held))
    finally:
        await server.stop(None)
    assert refused == {"RESOURCE_EXHAUSTED": past}, refused
    assert served == {"OK": limit}, served
