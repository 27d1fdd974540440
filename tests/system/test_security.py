"""Who may do what, on real processes: Admin behind its key, TLS on the gRPC hops and to NATS, NATS users
with the permissions deploy/nats.conf gives them, and `scaler up` on loopback only.

The certificates are made here (tests/certs.py); the nats-server is configured with deploy/nats.conf
(docs/operations.md, "NATS permissions") as written, its certificates' paths pointed at them.
"""

import asyncio
import contextlib
import ipaddress
import os
import re
import stat
import sys
from pathlib import Path

import grpc
import msgspec
import pytest

from scaler.controller import needs
from scaler.controller.leases import LEASES
from scaler.gateway import admin_key
from scaler.gateway.admin import SERVICE, Answer
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.subjects import partition
from scaler.runtime.bus import connected
from scaler.runtime.kv import entries
from scaler.runtime.natsd import NatsServer
from scaler.runtime.permissions import Need, Verb, publish, refused
from scaler.runtime.ports import free_port
from scaler.runtime.tls import ClientTls, ServerTls, channel
from tests.certs import Authority, Operator
from tests.cli.test_up import start_up, stop
from tests.processes import Parts, stderr_to
from tests.secured import Secured, write
from tests.system.test_nodes import KEYS, shared_between
from tests.system.test_sessions import stored_events

ROOT = Path(__file__).resolve().parents[2]


async def scaler(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`scaler ARGS` as a user runs it: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scaler", *args, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def component(module: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`python -m MODULE ARGS` run until it exits on its own: exit status and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, env={**os.environ, **(env or {})}, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    return proc.returncode, err.decode()


async def assign_and_idle(scaler_stub: pb_grpc.ScalerStub, request_id: str, key: str = "fn") -> str:
    meta = pb.Meta(key=key, runtime="python", memory_in_mb=128, timeout_in_secs=60)
    reply = await scaler_stub.Assign(pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=30)
    result = pb.Result(status_code=200, duration_in_ms=5)
    await scaler_stub.Idle(pb.IdleRequest(assigment=reply.assigment, result=result), timeout=30)
    return reply.assigment.instance_id


@pytest.fixture
def ca(tmp_path) -> Authority:
    return Authority(tmp_path / "certs")


# --- Admin: the key, TLS, and a call passed on to another node ---------------------------------------------


async def test_admin_needs_the_key_over_mutual_tls_also_when_passed_on_to_another_node(nats_url, ca, tmp_path):
    node_cert, client = ca.issue("node"), ca.issue("operator")
    stranger = Authority(tmp_path / "stranger").issue("stranger")  # a client certificate the node does not trust
    token_file = tmp_path / "admin.token"  # made by the first node, read by the second
    node_args = ("--tls-cert", node_cert.cert, "--tls-key", node_cert.key, "--tls-client-ca", ca.ca,
                 "--admin-token-file", str(token_file))  # fmt: skip
    stub = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await stub.start()
    nodes_log = tmp_path / "nodes.log"
    try:
        async with contextlib.AsyncExitStack() as stack:
            with stderr_to(nodes_log):  # the nodes' log, read whole (not capfd's, which a node writing races)
                parts = await stack.enter_async_context(
                    Parts(nats_url, f"127.0.0.1:{stub.port}", nodes=2, node_args=node_args, policy="demo")
                )
            await shared_between(nats_url, 2)
            gateway = parts.address("node")  # every call goes to the first node; the other owns about half the keys
            holders = {p: node for node, ps in (await lease_holders(nats_url)).items() for p in ps}
            assert len({holders[partition(k)] for k in KEYS}) == 2, "both nodes own some of the keys"
            trusted = ClientTls(ca.ca, client.cert, client.key)
            async with channel(gateway, trusted) as ch:
                await asyncio.gather(*(assign_and_idle(pb_grpc.ScalerStub(ch), f"r-{key}", key) for key in KEYS))
            seen = nodes_log.stat().st_size
            tls_cli = ("--gateway", gateway, "--gateway-ca", ca.ca, "--gateway-cert", client.cert)
            tls_cli += ("--gateway-key", client.key)

            token = token_file.read_text().strip()
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token) >= 32
            wrong = "not-" + token
            # Refused: no key, a garbled one, the wrong one; over TLS with a trusted client certificate.
            async with channel(gateway, trusted) as ch:
                delete = ch.unary_unary(f"/{SERVICE}/Delete")
                body = msgspec.json.encode({"key": KEYS[0]})
                for metadata, code in [
                    (None, grpc.StatusCode.UNAUTHENTICATED),
                    ((("authorization", token),), grpc.StatusCode.UNAUTHENTICATED),  # not `Bearer <token>`
                    ((("authorization", f"Bearer {wrong}"),), grpc.StatusCode.PERMISSION_DENIED),
                ]:
                    with pytest.raises(grpc.aio.AioRpcError) as refused_call:
                        await delete(body, metadata=metadata, timeout=30)
                    assert refused_call.value.code() == code, refused_call.value
            wrong_file = str(write(tmp_path / "wrong", wrong))
            refusals = [
                ((), "UNAUTHENTICATED"),
                (("--admin-token-file", wrong_file), "PERMISSION_DENIED: wrong admin key"),
            ]
            ran = await asyncio.gather(*(scaler("drain", *tls_cli, *args) for args, _ in refusals))
            for (code, _, err), (_, said) in zip(ran, refusals, strict=True):
                assert code == 1 and f"scaler drain: {said}" in err, err
            logged = nodes_log.read_bytes()[seen:].decode()
            assert logged.count("refused Admin/") == 5, logged  # one line each, naming the caller's address
            assert re.search(r"refused Admin/Delete from ipv4:127\.0\.0\.1:\d+: wrong admin key", logged), logged
            assert token not in logged and wrong not in logged
            # ... and nothing changed: every function still has its instance, no admin event was stored.
            assert len(stub.accounting.live) == len(KEYS)
            kinds = {type(x).__name__ for key in KEYS for batch in await stored_events(nats_url, key) for x in batch}
            assert not kinds & {"FunctionRestarted", "FunctionDeleted"}, kinds

            # Without a client certificate the TLS handshake itself is refused; with a stranger's too.
            for tls in (ClientTls(ca.ca), ClientTls(ca.ca, stranger.cert, stranger.key)):
                async with channel(gateway, tls) as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as no_cert:
                        await ch.unary_unary(f"/{SERVICE}/List")(b"{}", timeout=10)
                    assert no_cert.value.code() == grpc.StatusCode.UNAVAILABLE
            # With the key: each restart is decided by the function's owner, half of them on the other node; one
            # of those through the CLI.
            elsewhere = next(k for k in KEYS if holders[partition(k)] != holders[partition(KEYS[0])])
            cli = (*tls_cli, "--admin-token-file", str(token_file))
            code, out, err = await scaler("restart", elsewhere, *cli)
            assert code == 0, err
            assert out == f"{elsewhere}: 1 idle instance(s) retired, 0 busy one(s) retire when released\n"
            async with channel(gateway, trusted) as ch:
                restart = ch.unary_unary(f"/{SERVICE}/Restart")
                for key in (k for k in KEYS if k != elsewhere):
                    said = await restart(msgspec.json.encode({"key": key}), metadata=admin_key.metadata(token.encode()))
                    assert msgspec.json.decode(said, type=Answer).message.startswith("1 idle instance(s) retired")
            code, out, err = await scaler("functions", "--json", *cli)
            assert code == 0, err
            assert [f.key for f in msgspec.json.decode(out, type=Answer).functions] == sorted(KEYS)
    finally:
        await stub.stop()
    kinds = [type(x).__name__ for key in KEYS for batch in await stored_events(nats_url, key) for x in batch]
    assert kinds.count("FunctionRestarted") == len(KEYS)


async def lease_holders(nats_url: str) -> dict[str, list[int]]:
    """Each node's partitions, from the lease bucket."""
    async with connected(nats_url, "test") as nc:
        held = await entries(nc.jetstream(), LEASES)
    out: dict[str, list[int]] = {}
    for name, node in held.items():
        out.setdefault(node.decode(), []).append(int(name.removeprefix("p")))
    return out


async def test_a_node_listening_beyond_loopback_without_a_key_refuses_to_start():
    code, err = await component("scaler", "node", "--listen", f"0.0.0.0:{free_port()}", "--nats", "nats://127.0.0.1:1")
    assert code == 1, err
    (line,) = err.splitlines()  # one line, before it even looks for NATS
    assert "would let anyone who reaches it delete functions: give --admin-token-file PATH" in line, line


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--tls-cert", "/nope.pem", "--tls-key", "/nope.key"), "cannot read --tls-key /nope.key: No such file"),
        (("--tls-cert", "/etc/hostname"), "--tls-cert needs --tls-key"),
        (("--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"), "--tls-cert and --tls-key: not a certificate"),
        (("--tls-client-ca", "/etc/hostname"), "--tls-client-ca needs --tls-cert and --tls-key"),
    ],
)
async def test_a_node_says_in_one_line_which_tls_file_it_cannot_use(flags, said):
    code, err = await component("scaler", "node", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1", *flags)
    assert code == 1, err
    (line,) = err.splitlines()  # before it looks for NATS
    assert f"cannot start: {said}" in line, line


def test_the_admin_key_file_is_made_once_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "key"
    made = admin_key.load(str(path), make=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(made) >= 32
    assert admin_key.load(str(path), make=True) == made == admin_key.load(str(path))  # kept, not made again
    with pytest.raises(ValueError, match=r"cannot read --admin-token-file .*: No such file"):
        admin_key.load(str(tmp_path / "nope"))  # a client never makes one
    with pytest.raises(ValueError, match="is empty"):
        admin_key.load(str(write(tmp_path / "empty", "  ")))


# --- NATS: TLS, users, and what each role is permitted -----------------------------------------------------


async def test_a_node_with_nats_credentials_and_tls_serves_and_replays(ca, tmp_path):
    platform_pair, worker_pair = ca.issue("platform"), ca.issue("worker-client")
    stub = PlatformStub(
        "127.0.0.1:0", create_latency_ms=20, tls=ServerTls(platform_pair.cert, platform_pair.key, ca.ca)
    )
    await stub.start()
    async with Secured(tmp_path, ca) as nats:
        parts = Parts(nats.url, f"127.0.0.1:{stub.port}", policy="demo")
        try:
            await parts.supervisor.spawn(*parts.argv("node"), name="node", env_extra=nats.env("node"))
            platform_tls = (
                "--platform-ca",
                ca.ca,
                "--platform-cert",
                worker_pair.cert,
                "--platform-key",
                worker_pair.key,
            )
            await parts.supervisor.spawn("scaler.workers", "--platform", f"127.0.0.1:{stub.port}", *platform_tls,
                                         name="workers", env_extra=nats.env("worker"))  # fmt: skip
            async with grpc.aio.insecure_channel(parts.address("node")) as ch:
                first = await assign_and_idle(pb_grpc.ScalerStub(ch), "r1")
                assert await assign_and_idle(pb_grpc.ScalerStub(ch), "r2") == first  # reused: it was stored
            assert stub.accounting.created == stub.accounting.inits == 1  # the worker reached the platform over mTLS

            reader = nats.env("reader")
            code, out, err = await scaler("replay", "--verify", "--nats", nats.url, env=reader)
            assert code == 0 and "verified: 1 function equal to the running controller's state" in out, err
            code, out, err = await scaler("replay", "--key", "fn", "--nats", nats.url, env=reader)
            assert code == 0 and "timeline of fn" in out, err
            assert "permissions violation" not in err
            # The reader may read and nothing else: no append, no lease, no command, no change to the stream.
            writes = [
                publish("evt.n.0.fn", "append", stored=True),
                publish("$KV.scaler_leases.p0", "take a lease", stored=True),
                publish("cmd.0", "send a command"),
                publish("$JS.API.STREAM.UPDATE.EVENTS", "change the stream"),
                # tried as an attacker would: a purge is done if permitted (`publish` will not make it a need)
                Need(Verb.PUBLISH, "$JS.API.STREAM.PURGE.EVENTS", "purge the stream"),
            ]
            assert await refused(nats.access("reader"), writes) == writes
        finally:
            await parts.supervisor.stop()
            await stub.stop()


async def test_a_client_without_credentials_is_refused_by_nats(ca, tmp_path):
    async with Secured(tmp_path, ca) as nats:
        pair = ca.issue("someone")
        tls_only = {"SCALER_NATS_CA": ca.ca, "SCALER_NATS_CERT": pair.cert, "SCALER_NATS_KEY": pair.key}
        code, _, err = await scaler("replay", "--nats", nats.url, env=tls_only)
        assert code == 2 and f"scaler replay: NATS at {nats.url} refuses this client: authorization violation" in err
        code, err = await component("scaler", "node", "--listen", "127.0.0.1:0", "--nats", nats.url, env=tls_only)
        assert code == 1 and "refuses this client: authorization violation" in err and "Traceback" not in err, err
        # Right credentials, but no certificate the server's CA signed: refused at the handshake.
        stranger = Authority(tmp_path / "stranger")
        wrong_ca = {**nats.env("reader"), "SCALER_NATS_CA": stranger.ca}
        code, _, err = await scaler("replay", "--nats", nats.url, env=wrong_ca)
        assert code == 2 and "shows a certificate not trusted here" in err, err


async def test_a_node_given_a_workers_permissions_says_what_it_may_not_do(ca, tmp_path):
    async with Secured(tmp_path, ca) as nats:
        env = nats.env("worker")
        code, err = await component("scaler", "node", "--listen", "127.0.0.1:0", env=env)
    assert code == 1, err
    (line,) = [line for line in err.splitlines() if "does not permit" in line]
    assert f"NATS at {nats.url} does not permit the node to publish to $JS.API.STREAM.UPDATE.EVENTS" in line, line
    assert "publish to evt.n.0.scaler-permission-probe (append decisions to EVENTS)" in line
    assert "subscribe to cmd.0 (take its partitions' commands)" in line
    assert "publish to $JS.API.STREAM.INFO.EVENTS" not in line  # what a worker may do is not listed
    assert "leased" not in err  # refused before it took any partition


async def test_a_node_with_a_creds_file_serves_and_replays_on_an_operator_mode_nats(tmp_path):
    operator, stranger = Operator(), Operator()
    async with NatsServer(tmp_path / "nats", extra=operator.config()) as nats:
        creds = operator.creds(tmp_path / "node.creds", "node")
        parts = Parts(nats.url, "127.0.0.1:1")
        try:
            await parts.supervisor.spawn(*parts.argv("node"), name="node", env_extra={"SCALER_NATS_CREDS": str(creds)})
            async with grpc.aio.insecure_channel(parts.address("node")) as ch:  # loopback: Admin without a key
                listed = await ch.unary_unary(f"/{SERVICE}/List")(b"{}", timeout=30)
            assert msgspec.json.decode(listed, type=Answer).functions == []
            code, out, err = await scaler("replay", "--verify", "--nats", nats.url, "--nats-creds", str(creds))
            assert code == 0 and "verified: 0 functions" in out, err
            other = stranger.creds(tmp_path / "other.creds", "someone")  # signed by an operator this server knows not
            code, _, err = await scaler("replay", "--nats", nats.url, "--nats-creds", str(other))
            assert code == 2 and "refuses this client: authorization violation" in err, err
        finally:
            await parts.supervisor.stop()


async def test_the_permissions_check_has_no_effect(nats_url):
    assert await refused(nats_url, needs.NODE) == []  # a server without users permits everything
    async with connected(nats_url, "test") as nc:
        # No stream made (EVENTS, nor the buckets and the object store, streams too): nothing stored.
        assert await nc.jetstream().streams_info() == []


# --- a front gateway ---------------------------------------------------------------------------------------


async def test_a_front_gateway_serves_tls_on_its_own(nats_url, ca, tmp_path):
    """A front gateway (`python -m scaler.gateway`) over mutual TLS before a node in clear on loopback: served to a
    caller the CA vouches for, refused at the handshake to every other; without a client CA, to any caller over TLS;
    a certificate it cannot use said in one line at start, before it looks for NATS."""
    pair, client = ca.issue("gateway"), ca.issue("platform")
    stranger = Authority(tmp_path / "stranger", name="stranger CA")
    strange = stranger.issue("stranger")
    stub = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await stub.start()
    try:
        async with Parts(nats_url, f"127.0.0.1:{stub.port}", policy="demo") as parts:
            mutual, one_way = free_port(), free_port()
            for port, client_ca in ((mutual, ("--tls-client-ca", ca.ca)), (one_way, ())):
                await parts.supervisor.spawn(
                    "scaler.gateway", "--listen", f"127.0.0.1:{port}", "--tls-cert", pair.cert, "--tls-key", pair.key,
                    *client_ca, name=f"gateway-{port}",
                )  # fmt: skip
            gateway = f"127.0.0.1:{mutual}"
            async with channel(gateway, ClientTls(ca.ca, client.cert, client.key)) as ch:
                first = await assign_and_idle(pb_grpc.ScalerStub(ch), "r1")  # passed on to the node, over NATS
            for tls in (
                ClientTls(ca.ca),  # no certificate
                ClientTls(ca.ca, strange.cert, strange.key),  # one another CA signed
                ClientTls(stranger.ca, client.cert, client.key),  # not trusting the gateway's CA
                None,  # in clear
            ):
                async with channel(gateway, tls) as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as refused_call:
                        await assign_and_idle(pb_grpc.ScalerStub(ch), "r-refused")
                    assert refused_call.value.code() == grpc.StatusCode.UNAVAILABLE, tls
            async with channel(f"127.0.0.1:{one_way}", ClientTls(ca.ca)) as ch:  # no client CA: any caller over TLS
                assert await assign_and_idle(pb_grpc.ScalerStub(ch), "r2") == first
            async with channel(f"127.0.0.1:{one_way}", None) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as in_clear:
                    await assign_and_idle(pb_grpc.ScalerStub(ch), "r-clear")
                assert in_clear.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stub.accounting.created == 1  # one cold start: the calls after were warm, or refused at the handshake
    finally:
        await stub.stop()
    code, err = await component("scaler.gateway", "--listen", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1",
                                "--tls-cert", pair.cert)  # fmt: skip
    assert code == 1, err
    (line,) = err.splitlines()  # before it looks for NATS
    assert "cannot start: --tls-cert needs --tls-key" in line, line


# --- the workers and the platform --------------------------------------------------------------------------


async def test_a_worker_trusting_another_ca_refuses_the_platform_in_one_line(nats_url, ca, tmp_path):
    pair = ca.issue("platform")
    stub = PlatformStub("127.0.0.1:0", tls=ServerTls(pair.cert, pair.key))
    await stub.start()
    try:
        other = Authority(tmp_path / "other", name="another CA")
        platform = f"127.0.0.1:{stub.port}"
        code, err = await component(
            "scaler.workers", "--nats", nats_url, "--platform", platform, "--platform-ca", other.ca
        )
        assert code == 1, err
        (line,) = err.splitlines()
        assert f"cannot start: cannot trust the platform at {platform}: " in line and "(--platform-ca)" in line, line
        # In clear against a platform that speaks TLS only: the calls fail, nothing is sent in clear to it.
        assert stub.accounting.created == 0
    finally:
        await stub.stop()


# --- loopback by default -----------------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), set()).add(int(stat_file.parent.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, set()) - found)
    return found


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """The (address, port) each of `pids` listens on, from the kernel's socket table."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                raw, port = cols[1].split(":")
                packed = b"".join(bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8))
                address = ipaddress.ip_address(packed)
                mapped = getattr(address, "ipv4_mapped", None)  # 127.0.0.1 on a dual-stack socket: ::ffff:7f00:1
                out.add((str(mapped or address), int(port, 16)))
    return out


async def test_scaler_up_listens_on_loopback_only_unless_told(tmp_path):
    proc, address, _ = await start_up("--metrics-port", "0")
    try:
        sockets = listening(descendants(proc.pid))
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
    # gRPC, metrics, the stub, NATS and its monitoring: every one on loopback.
    assert len(sockets) >= 5 and int(address.rsplit(":", 1)[1]) in {p for _, p in sockets}, sockets
    assert all(ipaddress.ip_address(host).is_loopback for host, _ in sockets), sockets
    # Told to open up without a key: refused, saying how.
    code, err = await component("scaler", "up", "--port", "0", "--host", "0.0.0.0")
    assert code == 1 and "scaler up failed: node: Admin on 0.0.0.0:" in err, err
