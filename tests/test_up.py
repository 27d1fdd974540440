"""`scaler up` as a user runs it: one process tree, one ready line, a clean stop on Ctrl-C."""

import asyncio
import re
import signal
import sys

import grpc

from platform_stub.server import PlatformStub
from proto import serverless_sim_pb2 as pb
from proto import serverless_sim_pb2_grpc as pb_grpc
from runtime.natsd import NatsServer

READY = re.compile(r"scaler ready: gRPC [\d.]+:(\d+),")


async def start_up(*args: str) -> tuple[asyncio.subprocess.Process, str, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler.cli", "up", "--port", "0", *args, stderr=asyncio.subprocess.PIPE
    )
    lines: list[str] = []
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, f"scaler up exited early: {''.join(lines)}"
            lines.append(line)
            if m := READY.search(line):
                return proc, f"127.0.0.1:{m.group(1)}", lines


async def assign_and_idle(address: str, request_id: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)
        meta = pb.Meta(key="hello", runtime="python", memory_in_mb=128)
        reply = await scaler.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=20)
        await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)), timeout=20)
        return reply.assigment.instance_id


async def refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return True
    writer.close()
    return False


async def stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        rest = (await proc.stderr.read()).decode()
        return await proc.wait(), rest


async def test_up_serves_and_stops_cleanly(tmp_path):
    proc, address, lines = await start_up("--data-dir", str(tmp_path))
    try:
        assert sum("ready" in line for line in lines) == 1, lines  # one line when ready, components quiet
        assert await assign_and_idle(address, "r1") == "hello-1"
        assert await assign_and_idle(address, "r2") == "hello-1"  # reused
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
    assert "Traceback" not in rest
    assert await refuses_connections(address)
    assert any((tmp_path / "nats").rglob("*.blk")), "the embedded NATS kept its store in --data-dir"
    assert any((tmp_path / "nats").rglob("OBJ_scaler_snapshots")), "and with it the controller's snapshots"


async def test_up_uses_an_external_nats_and_platform_and_binds_where_told(tmp_path):
    stub = PlatformStub("127.0.0.1:0")
    await stub.start()
    try:
        async with NatsServer(tmp_path / "nats") as nats:
            platform = f"127.0.0.1:{stub.port}"
            proc, address, lines = await start_up("--nats", nats.url, "--platform", platform, "--host", "127.0.0.1")
            try:
                assert "scaler ready: gRPC 127.0.0.1:" in lines[-1], "bound to loopback only, not 0.0.0.0"
                assert await assign_and_idle(address, "r1") == "hello-1"
                assert stub.accounting.created == 1  # the external platform did the work
            finally:
                code, rest = await stop(proc)
            assert code == 0, rest
    finally:
        await stub.stop()
