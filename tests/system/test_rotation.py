"""Certificates, CAs and the admin key replaced under load, on every hop, no process restarted and no call failed.

A CA rollover as an operator runs one, each step files moved over those the processes were started with: every
trust given the new CA beside the old, then every certificate and key replaced by one the new CA signed (one
listener's certificate a while before its key), then the old CA taken away; the admin key likewise (the new one
put below the old, then first, then the old taken away). Meanwhile platforms call Assign and Idle on the node and
through a front gateway (each instance destroyed, so every Assign is a cold start through the workers to the
platform, and every Idle a DestroySlot), and an operator calls Admin; nats-server reads its configuration again
after each step (SIGHUP). Then every listener is shown to show and trust only the new, and every client to
connect with the new: the platform's listener and NATS restarted, each connection made again.
"""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest

from scaler.gateway import admin_key
from scaler.gateway.admin import SERVICE
from scaler.platform_stub.server import PlatformStub
from scaler.proto import platform_admin_pb2 as admin_pb
from scaler.proto import platform_admin_pb2_grpc as admin_grpc
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.access import NatsAccess
from scaler.runtime.bus import Refused, connected
from scaler.runtime.ports import free_port
from scaler.runtime.tls import ClientTls, ServerTls, channel
from tests.certs import Authority, Pair
from tests.processes import Driver, Parts, stderr_to
from tests.secured import Secured
from tests.system.test_security import assign_and_idle

LISTENERS = ("node-listen", "gateway-listen", "stub-listen")
NATS_CLIENTS = ("node-nats", "gateway-nats", "worker-nats")


class Live:
    """The files the processes are pointed at, each replaced as an operator would: written beside, moved over."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def put(self, name: str, data: bytes) -> None:
        beside = self.folder / f".{name}.new"
        beside.write_bytes(data)
        os.replace(beside, self.folder / name)

    def pair(self, name: str, pair: Pair, part: str = "both") -> None:
        if part in ("both", "cert"):
            self.put(f"{name}.pem", Path(pair.cert).read_bytes())
        if part in ("both", "key"):
            self.put(f"{name}.key", Path(pair.key).read_bytes())

    def trust(self, name: str, *cas: Authority) -> None:
        self.put(name, b"".join(Path(ca.ca).read_bytes() for ca in cas))

    def client(self, name: str, ca: str) -> ClientTls:
        return ClientTls(self.path(ca), self.path(f"{name}.pem"), self.path(f"{name}.key"))


class Log:
    """The children's stderr (`stderr_to`), as it comes: their one line per reload."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = ""

    def read(self) -> str:
        self.text = self.path.read_text()
        return self.text

    def reloads(self, marker: str) -> int:
        return sum("reloaded" in line and marker in line for line in self.read().splitlines())

    def count(self, said: str) -> int:
        return self.read().count(said)

    async def said(self, what: str) -> None:
        await until(lambda: self.count(what), 30)

    async def until(self, counts: dict[str, int], seconds: float = 60) -> None:
        try:
            await until(lambda: all(self.reloads(marker) >= n for marker, n in counts.items()), seconds)
        except TimeoutError:
            seen = {marker: self.reloads(marker) for marker in counts}
            raise AssertionError(f"reloads seen {seen}, wanted {counts}:\n{self.text[-4000:]}") from None
        assert {marker: self.reloads(marker) for marker in counts} == counts  # one line each, not more


async def until(condition, seconds: float) -> None:
    """Wait until `condition()` holds (what other processes do, seen by polling)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.2)


async def refused_handshake(call) -> bool:
    try:
        await call()
    except grpc.aio.AioRpcError as e:
        return e.code() is grpc.StatusCode.UNAVAILABLE
    return False


async def test_certificates_cas_and_the_admin_key_rotate_under_load_with_no_call_failed(tmp_path):
    old, new = Authority(tmp_path / "old", "old CA"), Authority(tmp_path / "new", "new CA")
    live = Live(tmp_path / "live")
    nats_dir = Live(tmp_path / "live" / "nats")
    issued = {n: {ca: ca.issue(f"{n}-{ca.name[:3]}") for ca in (old, new)} for n in (*LISTENERS, *NATS_CLIENTS)}
    issued |= {n: {ca: ca.issue(f"{n}-{ca.name[:3]}") for ca in (old, new)} for n in ("nats", "worker-platform")}
    for name, pairs in issued.items():
        (nats_dir if name == "nats" else live).pair(name, pairs[old])
    nats_dir.trust("ca.pem", old)
    for trust in ("callers-ca.pem", "nats-ca.pem", "platform-ca.pem"):
        live.trust(trust, old)
    token = live.path("admin.token")
    old_key, new_key = b"old-" + os.urandom(16).hex().encode(), b"new-" + os.urandom(16).hex().encode()
    live.put("admin.token", old_key + b"\n")
    # The test's own callers: platforms trusting both CAs from the start, each showing a certificate the old one
    # signed; after the rollover, callers with only the new, or only the old.
    live.trust("both.pem", old, new)
    both = live.path("both.pem")
    platform = old.issue("platform")
    caller = ClientTls(str(both), platform.cert, platform.key)
    fresh = new.issue("fresh")
    new_only = ClientTls(new.ca, fresh.cert, fresh.key)
    old_only = ClientTls(old.ca, fresh.cert, fresh.key)  # trusts the old CA alone
    old_cert = ClientTls(str(both), platform.cert, platform.key)  # shows a certificate the old CA signed

    stub = PlatformStub(
        f"127.0.0.1:{free_port()}",
        create_latency_ms=20,
        tls=ServerTls(live.path("stub-listen.pem"), live.path("stub-listen.key"), live.path("callers-ca.pem")),
    )
    await stub.start()
    secured = Secured(tmp_path, old, certs=nats_dir.folder)
    await secured.start()
    info = {"SCALER_LOG_LEVEL": "INFO"}

    def nats_env(role: str, name: str) -> dict[str, str]:
        return secured.env(role) | info | {
            "SCALER_NATS_CA": live.path("nats-ca.pem"),
            "SCALER_NATS_CERT": live.path(f"{name}-nats.pem"),
            "SCALER_NATS_KEY": live.path(f"{name}-nats.key"),
        }  # fmt: skip

    def listen(name: str) -> tuple[str, ...]:
        return ("--tls-cert", live.path(f"{name}-listen.pem"), "--tls-key", live.path(f"{name}-listen.key"),
                "--tls-client-ca", live.path("callers-ca.pem"))  # fmt: skip

    node_args = (*listen("node"), "--admin-token-file", token)
    parts = Parts(secured.url, f"127.0.0.1:{stub.port}", policy="demo", node_args=node_args)
    gateway_port = free_port()
    platform_tls = ("--platform-ca", live.path("platform-ca.pem"), "--platform-cert",
                    live.path("worker-platform.pem"), "--platform-key", live.path("worker-platform.key"))  # fmt: skip
    log = Log(tmp_path / "children.log")
    try:
        with stderr_to(log.path):
            await parts.supervisor.spawn(*parts.argv("node"), name="node", env_extra=nats_env("node", "node"))
            await parts.supervisor.spawn("scaler.workers", "--platform", f"127.0.0.1:{stub.port}", *platform_tls,
                                         name="workers", env_extra=nats_env("worker", "worker"))  # fmt: skip
            gateway_argv = ("--listen", f"127.0.0.1:{gateway_port}", "--reply-timeout", "30", *listen("gateway"))
            await parts.supervisor.spawn("scaler.gateway", *gateway_argv, name="gateway",
                                         env_extra=nats_env("node", "gateway"))  # fmt: skip
        node, gateway = parts.address("node"), f"127.0.0.1:{gateway_port}"
        drivers = [
            Driver(address, keys=keys, clients=3, tls=caller, destroy=True, retry_assign=True, attempts=120, tag=tag)
            for address, keys, tag in ((node, ("fa", "fb", "fc"), "n"), (gateway, ("ga", "gb", "gc"), "g"))
        ]
        admin_calls: list[tuple[float, str]] = []  # when, and "ok" or what went wrong

        async def operator(stop: asyncio.Event) -> None:
            async with channel(node, caller) as ch:
                list_ = ch.unary_unary(f"/{SERVICE}/List")
                while not stop.is_set():
                    key = admin_key.load(token)  # as `scaler functions` does at each run: the first key
                    try:
                        await list_(b"{}", metadata=admin_key.metadata(key), timeout=30)
                        admin_calls.append((time.monotonic(), "ok"))
                    except grpc.aio.AioRpcError as e:
                        admin_calls.append((time.monotonic(), f"{e.code().name}: {e.details()}"))
                    await asyncio.sleep(0.1)

        stop_admin = asyncio.Event()
        load = [asyncio.create_task(d.run()) for d in drivers] + [asyncio.create_task(operator(stop_admin))]
        await asyncio.sleep(2)
        began = time.monotonic()

        # 1. Every trust given the new CA beside the old; the new admin key below the old: taken, not yet sent.
        for trust in ("callers-ca.pem", "nats-ca.pem", "platform-ca.pem"):
            live.trust(trust, old, new)
        nats_dir.trust("ca.pem", old, new)
        live.put("admin.token", old_key + b"\n" + new_key + b"\n")
        secured.server.reload()
        expected = {"node-listen.pem": 1, "gateway-listen.pem": 1, "node-nats.pem": 1, "gateway-nats.pem": 1,
                    "worker-nats.pem": 1, "worker-platform.pem": 1, token: 1}  # fmt: skip
        await log.until(expected)
        live.put("admin.token", new_key + b"\n" + old_key + b"\n")  # now sent: the callers move to it
        expected[token] += 1
        await log.until(expected)

        # 2. Every certificate and key replaced by one the new CA signed: the node's listener's certificate a
        # while before its key (meanwhile the pair does not match: said once, and the old pair kept); the old
        # admin key taken away.
        live.pair("node-listen", issued["node-listen"][new], "cert")
        await log.said("changed, but cannot be used")
        await asyncio.sleep(1.5)  # a poll or two more on the half-replaced pair: nothing more said, nothing broken
        live.pair("node-listen", issued["node-listen"][new], "key")
        for name, pairs in issued.items():
            if name not in ("node-listen", "nats"):
                live.pair(name, pairs[new])
        nats_dir.pair("nats", issued["nats"][new])
        live.put("admin.token", new_key + b"\n")
        secured.server.reload()
        expected = {marker: n + 1 for marker, n in expected.items()}
        await log.until(expected)
        assert log.count("changed, but cannot be used") == 1, log.text[-3000:]

        # 3. The old CA taken away from every trust.
        for trust in ("callers-ca.pem", "nats-ca.pem", "platform-ca.pem"):
            live.trust(trust, new)
        nats_dir.trust("ca.pem", new)
        secured.server.reload()
        expected = {marker: n + (marker != token) for marker, n in expected.items()}
        await log.until(expected)
        rotated = time.monotonic()
        await asyncio.sleep(2)

        # Each listener now shows the new certificate and trusts only the new CA, from its next connection on.
        async with channel(node, new_only) as ch:
            listed = ch.unary_unary(f"/{SERVICE}/List")
            await listed(b"{}", metadata=admin_key.metadata(new_key), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await listed(b"{}", metadata=admin_key.metadata(old_key), timeout=30)
            assert wrong.value.code() is grpc.StatusCode.PERMISSION_DENIED
        for address in (node, gateway):
            async with channel(address, new_only) as ch:
                await assign_and_idle(pb_grpc.ScalerStub(ch), f"fresh-{address}", "fresh")
            for tls in (old_only, old_cert):
                async with channel(address, tls) as ch:
                    assert await refused_handshake(lambda: assign_and_idle(pb_grpc.ScalerStub(ch), "no", "no"))
        platform_new = live.client("worker-platform", "platform-ca.pem")
        for tls, served in ((platform_new, True), (old_cert, False)):
            async with channel(f"127.0.0.1:{stub.port}", tls) as ch:
                ask = lambda: admin_grpc.PlatformAdminStub(ch).ListSlots(admin_pb.ListSlotsRequest(), timeout=10)  # noqa: E731
                assert served != await refused_handshake(ask)
        nats_new = NatsAccess(secured.url, live.client("node-nats", "nats-ca.pem"), nkey=str(secured.seeds["node"]),
                              role="node")  # fmt: skip
        async with connected(nats_new, "test"):
            pass
        nats_old = NatsAccess(secured.url, ClientTls(str(both), platform.cert, platform.key),
                              nkey=str(secured.seeds["node"]), role="node")  # fmt: skip
        with pytest.raises(Refused):
            async with connected(nats_old, "test"):
                pass

        # Each client connects with the new files: the platform's listener and NATS restarted, under the load.
        await stub.stop()
        await stub.start()
        restarting = time.monotonic()
        await secured.server.stop()
        await secured.start()
        restarted = time.monotonic()
        await until(lambda: all(any(c.got_at > restarted and not c.error for c in d.calls) for d in drivers), 120)
        await asyncio.sleep(2)
        for d in drivers:
            d.stop()
        stop_admin.set()
        await asyncio.gather(*load)
    finally:
        await parts.supervisor.stop()
        await stub.stop()
        await secured.server.stop()

    calls = [c for d in drivers for c in d.calls]
    failed = [f"{c.request_id}: {c.error}" for c in calls if c.error]
    assert failed == [], failed[:10]
    during = [(c.request_id, why) for c in calls for at, why in c.refusals if began <= at < rotated + 2]
    assert during == [], during[:10]  # not even a refusal a platform would repeat while the files changed
    assert all(d.overlaps() == [] for d in drivers)
    rotating = [c for c in calls if began <= c.got_at <= rotated]
    assert len(rotating) >= 10, len(rotating)  # calls were served all along the rotation
    assert len(admin_calls) >= 10 and [a for a in admin_calls if a[1] != "ok" and a[0] < restarting] == []
    assert {said.split(":")[0] for _, said in admin_calls} <= {"ok", "UNAVAILABLE", "DEADLINE_EXCEEDED"}  # restarted
    assert stub.accounting.created >= len(calls) // 2  # cold starts: the workers called the platform throughout


async def test_sighup_reads_the_files_again_and_says_when_nothing_changed(tmp_path):
    """SIGHUP to a process of ours (the platform stub here; every one runs so: scaler/runtime/service.py) reads its
    files again, one line for what changed or one saying nothing did, and stops nothing."""
    old, new = Authority(tmp_path / "old", "old CA"), Authority(tmp_path / "new", "new CA")
    live = Live(tmp_path / "live")
    live.pair("stub", old.issue("stub"))
    flags = ("--tls-cert", live.path("stub.pem"), "--tls-key", live.path("stub.key"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler.platform_stub", "--listen", "127.0.0.1:0", *flags,
        env={**os.environ, "SCALER_LOG_LEVEL": "INFO"}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:

        async def line_with(said: str) -> str:
            async with asyncio.timeout(30):
                while True:
                    line = (await proc.stderr.readline()).decode()
                    assert line, "the process ended"
                    if said in line:
                        return line

        address = (await line_with("ready: platform stub on ")).split(" on ", 1)[1].split(" ", 1)[0]
        proc.send_signal(signal.SIGHUP)
        assert "SIGHUP: no certificate, CA or key changed (1 watched)" in await line_with("SIGHUP")
        live.pair("stub", new.issue("stub-new"))
        proc.send_signal(signal.SIGHUP)
        assert "reloaded TLS (--tls-cert, -key, -client-ca)" in await line_with("reloaded")
        async with channel(address, ClientTls(new.ca)) as ch:  # shows the new certificate
            await admin_grpc.PlatformAdminStub(ch).ListSlots(admin_pb.ListSlotsRequest(), timeout=10)
        assert proc.returncode is None
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.communicate()
    assert proc.returncode == 0
