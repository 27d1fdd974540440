"""Least privilege, from the attacker's side: each role's NATS credentials, under deploy/nats.conf as written, tried
against what the role must not do, beside a node and the workers serving calls under the same configuration.

Every attempt is the real thing (a forged batch, an operator's Delete, a lease taken, the stream deleted, the
snapshots read...), made with nats-py's own calls; each is refused by NATS itself, which names the subject in a
permissions violation, and afterwards nothing has changed: the stream, its batches, the leases, the functions.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, StreamConfig

from scaler.controller import snapshots
from scaler.controller.leases import LEASES
from scaler.controller.partitions import OWNERS
from scaler.platform_stub.server import PlatformStub
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.commands import Code, Delete, Restart, SlotFailed, decode_reply, encode
from scaler.proto.events import Released
from scaler.proto.subjects import EVENTS, command_subject, event_subject, partition, report_subject
from scaler.runtime.access import NatsAccess
from scaler.runtime.bus import connected
from scaler.runtime.kv import entries
from scaler.runtime.permissions import VIOLATION
from tests.certs import Authority
from tests.processes import Parts, stderr_to
from tests.secured import Secured
from tests.system.test_security import assign_and_idle, component, scaler
from tests.system.test_sessions import stored_events

KEY = "fn"
ANSWER_S = 3.0  # how long an attempt waits for an answer it will not get: NATS dropped it


@dataclass(frozen=True)
class Attempt:
    what: str
    refused_on: str  # the subject NATS names when it refuses it (a prefix: some carry a name made up on the way)
    do: Callable[[Client], Awaitable[object]]
    may: frozenset[str] = frozenset()  # the roles that may: it is done for them


NODE, READER, WORKER = frozenset({"node"}), frozenset({"node", "reader"}), frozenset({"worker"})


def attempts(forged: bytes, lease: str) -> list[Attempt]:
    """What a role must not do (but those in `may`), each as an attacker would try it."""
    js = lambda nc: nc.jetstream(timeout=ANSWER_S)  # noqa: E731
    delete = encode(Delete(key=KEY, reason="an attacker's", asked_ms=time.time_ns() // 1_000_000))
    report = encode(SlotFailed(key=KEY, instance_id=f"{KEY}-999", reason="an attacker's"))  # of no instance: a no-op
    cut = StreamConfig(name=EVENTS, subjects=["evt.>"], max_msgs=1)
    objects, api = f"OBJ_{snapshots.BUCKET}", "$JS.API.STREAM"

    async def read_snapshots(nc: Client) -> object:
        return await js(nc).subscribe(f"$O.{snapshots.BUCKET}.>", stream=objects, ordered_consumer=True)

    return [
        Attempt("append a batch to EVENTS", event_subject(KEY), lambda nc: js(nc).publish(event_subject(KEY), forged),
                NODE),
        Attempt("send an operator's Delete", command_subject(KEY),
                lambda nc: nc.request(command_subject(KEY), delete, timeout=ANSWER_S), NODE),
        Attempt("take a partition's lease", lease, lambda nc: js(nc).publish(lease, b"attacker"), NODE),
        Attempt("delete EVENTS", f"{api}.DELETE.{EVENTS}", lambda nc: js(nc).delete_stream(EVENTS)),
        Attempt("delete the lease bucket", f"{api}.DELETE.KV_{LEASES}",
                lambda nc: js(nc).delete_stream(f"KV_{LEASES}")),
        Attempt("cut EVENTS's retention", f"{api}.UPDATE.{EVENTS}", lambda nc: js(nc).update_stream(cut), NODE),
        Attempt("purge EVENTS", f"{api}.PURGE.{EVENTS}", lambda nc: js(nc).purge_stream(EVENTS)),
        Attempt("delete a batch from EVENTS", f"{api}.MSG.DELETE.{EVENTS}", lambda nc: js(nc).delete_msg(EVENTS, 1)),
        Attempt("find the snapshots", f"{api}.INFO.{objects}", lambda nc: js(nc).object_store(snapshots.BUCKET),
                READER),
        Attempt("read the snapshots", f"$JS.API.CONSUMER.CREATE.{objects}", read_snapshots, READER),
        Attempt("send a worker's report", report_subject(KEY),
                lambda nc: nc.request(report_subject(KEY), report, timeout=ANSWER_S), WORKER),
        Attempt("hear the commands", "cmd.>", lambda nc: nc.subscribe("cmd.>"), NODE),
        Attempt("hear a node's answers (and what it reads)", "_INBOX.node.>", lambda nc: nc.subscribe("_INBOX.node.>"),
                NODE),
        Attempt("answer in a node's place", "_INBOX.node.x", lambda nc: nc.publish("_INBOX.node.x", b""), NODE),
    ]  # fmt: skip


async def tried(access: NatsAccess, tries: list[Attempt]) -> dict[str, str]:
    """Each attempt made on one connection as `access`: what NATS said of it (its permissions violation), or how it
    ended when NATS said nothing ("done", or the error)."""
    violations: list[str] = []

    async def on_error(e: Exception) -> None:
        violations.append(str(e))

    nc = await nats.connect(access.servers, error_cb=on_error, allow_reconnect=False, **access.options())
    try:
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(a.do(nc), ANSWER_S * 2) for a in tries), return_exceptions=True
        )
        seen = -1
        while seen != len(violations):  # a violation may come after the flush's answer (scaler/runtime/permissions.py)
            seen = len(violations)
            await nc.flush(timeout=ANSWER_S)
    finally:
        await nc.close()
    said: dict[str, str] = {}
    for a, outcome in zip(tries, outcomes, strict=True):
        named = [v for v in violations if VIOLATION in v.lower() and f'"{a.refused_on.lower()}' in v.lower()]
        said[a.what] = named[0] if named else ("done" if not isinstance(outcome, BaseException) else repr(outcome))
    return said


async def looks(node: NatsAccess) -> dict[str, object]:
    """What an attacker would change: EVENTS (its configuration, first batch, how many), the leases, the snapshots."""
    async with connected(node, "test") as nc:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS)
        held = await entries(js, LEASES)
        kept = await (await js.object_store(snapshots.BUCKET)).get("target")
        return {
            "EVENTS": (info.config.max_msgs, info.config.max_age, info.config.subjects, info.state.first_seq),
            "batches": info.state.messages,
            "leases": held,
            "snapshot": kept.data,
        }


async def test_each_role_is_refused_by_nats_what_it_must_not_do(ca, tmp_path):
    stub = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await stub.start()
    node_log = tmp_path / "node.log"
    async with Secured(tmp_path, ca) as nats_server:
        parts = Parts(nats_server.url, f"127.0.0.1:{stub.port}", policy="demo")
        try:
            with stderr_to(node_log):
                await parts.supervisor.spawn(*parts.argv("node"), name="node", env_extra=nats_server.env("node"))
            await parts.supervisor.spawn("scaler.workers", "--platform", f"127.0.0.1:{stub.port}", name="workers",
                                         env_extra=nats_server.env("worker"))  # fmt: skip
            async with grpc.aio.insecure_channel(parts.address("node")) as ch:
                first = await assign_and_idle(pb_grpc.ScalerStub(ch), "r1", KEY)
            node = nats_server.access("node")
            async with asyncio.timeout(30):  # the Idle is answered at once, its release stored right behind it
                while not any(isinstance(x, Released) for b in await stored_events(node, KEY) for x in b):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            async with connected(node, "test") as nc:  # something in the snapshots' bucket for the attackers to want
                await (await nc.jetstream().object_store(snapshots.BUCKET)).put("target", b"what a node keeps")
                forged = (await nc.jetstream().get_last_msg(EVENTS, event_subject(KEY, "c"))).data  # a real batch
            lease = f"$KV.{LEASES}.p{partition(KEY)}"
            before = await looks(node)
            assert before["leases"], "the node holds its leases"

            every = attempts(forged, lease)
            for role in ("worker", "reader", "node"):  # a node is not made to do what it may: it would be done
                tries = [a for a in every if role != "node" or role not in a.may]
                said = await tried(nats_server.access(role), tries)
                for a in tries:
                    if role in a.may:  # a reader reads the snapshots, a worker reports: the same calls, permitted
                        assert said[a.what] == "done", (role, a.what, said[a.what])
                    else:
                        assert "permissions violation" in said[a.what].lower(), f"the {role} could {a.what}: {said}"
                assert role != "node" or len(tries) == 5  # delete EVENTS or a bucket, purge, delete a batch, report

            # A worker may report, and NATS lets it publish on the report subjects: there the node takes reports
            # and nothing else. An operator's Restart sent as a report is refused by the node, and not stored.
            restart = Restart(key=KEY, reason="an attacker's", asked_ms=time.time_ns() // 1_000_000)
            async with connected(nats_server.access("worker"), "test") as nc:
                answer = decode_reply((await nc.request(report_subject(KEY), encode(restart), timeout=30)).data)
            assert answer.code is Code.INVALID_ARGUMENT and "a Restart is not a report" in answer.message, answer

            # What a worker may do with the consumers it may make on EVENTS (NATS cannot say to which subject they
            # deliver): the function's batches delivered into the lease bucket are stored nowhere, and onto its
            # partition's commands (to the nodes' queue group) are refused by the node as unreadable.
            async with connected(nats_server.access("worker"), "test") as nc:
                for deliver in (lease, command_subject(KEY)):
                    config = ConsumerConfig(deliver_subject=deliver, deliver_group=OWNERS)
                    config.filter_subject = event_subject(KEY, "c")
                    await nc.jetstream().add_consumer(EVENTS, config)
            refusing = f"refusing a command on {event_subject(KEY, 'c')}"
            async with asyncio.timeout(30):
                while refusing not in node_log.read_text():  # noqa: ASYNC110
                    await asyncio.sleep(0.1)

            # The operator holds the admin key and a certificate the CA signed, but no NATS user: refused outright.
            operator = ca.issue("operator")
            tls_only = {"SCALER_NATS_CA": ca.ca, "SCALER_NATS_CERT": operator.cert, "SCALER_NATS_KEY": operator.key}
            code, _, err = await scaler("replay", "--nats", nats_server.url, env=tls_only)
            assert code == 2 and "refuses this client: authorization violation" in err, err

            # Nothing changed: the stream whole, no batch appended or removed, the leases the node's, the functions
            # as they were, no restart or delete stored.
            after = await looks(node)
            assert after == before
            kinds = {type(x).__name__ for batch in await stored_events(node, KEY) for x in batch}
            assert not kinds & {"FunctionRestarted", "FunctionDeleted"}, kinds
            async with grpc.aio.insecure_channel(parts.address("node")) as ch:
                assert await assign_and_idle(pb_grpc.ScalerStub(ch), "r2", KEY) == first  # still served, same instance
            assert "a Restart is not a report" in node_log.read_text()  # the node said what it refused
        finally:
            await parts.supervisor.stop()
            await stub.stop()


async def test_workers_check_their_nats_permissions_at_start(ca, tmp_path):
    async with Secured(tmp_path, ca) as nats_server:
        code, err = await component("scaler.workers", "--platform", "127.0.0.1:1", env=nats_server.env("reader"))
    assert code == 1, err
    (line,) = [line for line in err.splitlines() if "does not permit" in line]
    assert f"NATS at {nats_server.url} does not permit the workers to " in line, line
    assert "publish to report.scaler-permission-probe (report what the platform did)" in line
    assert "subscribe to _INBOX.worker.scaler-permission-probe (hear its answers and its batches)" in line
    assert "subscribe to reconcile.ask" in line
    assert "publish to $JS.API.STREAM.INFO.EVENTS" not in line  # what a reader may do too is not listed


@pytest.fixture
def ca(tmp_path) -> Authority:
    return Authority(tmp_path / "certs")
