"""Several nodes on one NATS: they share the partitions, each serves every function, and one that dies is
taken over. Real processes (nodes, workers), a real nats-server (or a cluster of three), the real stub."""

import asyncio
import io
import time
from collections import Counter

import pytest

from scaler import replay
from scaler.controller.core.policy import get_policy
from scaler.controller.leases import LEASES, holders
from scaler.controller.shell import Controller
from scaler.platform_stub.server import PlatformStub
from scaler.proto.commands import Assign, Idle
from scaler.proto.events import Meta
from scaler.proto.subjects import PARTITIONS
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsCluster, NatsServer
from scaler.simulator.offline import Simulation
from scaler.simulator.shapes import generate
from scaler.store.config import ensure_stream
from tests.invariants import Assignments
from tests.processes import Driver, Parts, settled
from tests.stack import Stack, eventually

KEYS = tuple(f"fn{n}" for n in range(12))  # spread over the partitions, so over both nodes
META = Meta(memory_mb=128, runtime="python", timeout_s=60)


async def leases(nats_url: str) -> Counter[str]:
    """Partitions held, by node."""
    async with connected(nats_url, "test") as nc:
        return Counter((await holders(nc.jetstream())).values())


async def shared_between(nats_url: str, nodes: int, seconds: float = 20) -> Counter[str]:
    """Wait until `nodes` nodes hold every partition between them, as evenly as they can."""
    async with asyncio.timeout(seconds):
        while True:
            try:
                held = await leases(nats_url)
            except TimeoutError:  # a NATS node just died: the cluster moves its leaders
                continue
            if len(held) == nodes and sum(held.values()) == PARTITIONS and max(held.values()) - min(held.values()) <= 1:
                return held
            await asyncio.sleep(0.2)


async def check(nats_url: str, stub: PlatformStub, calls: list, killed_ms: int | None = None) -> None:
    """No request assigned while it holds an instance, no instance held by two requests, no slot leaked (but those a
    platform worker killed at `killed_ms` leaves on a platform that cannot prevent it), replay == state."""
    await settled(nats_url, stub, killed_ms=killed_ms)
    async with connected(nats_url, "test") as nc:
        assignments = Assignments()
        await replay.replay(nc, seen=assignments)
        assert assignments.requests and assignments.twice == []
        assert {c.request_id for c in calls if c.instance} <= assignments.requests
        out = io.StringIO()
        assert await replay.verify(nc, None, out) == 0, out.getvalue()


async def two_nodes_then_one_dies(nats_url: str, stub: PlatformStub, replicas: int = 1, nats_down=None) -> None:
    async with Parts(nats_url, f"127.0.0.1:{stub.port}", nodes=2, replicas=replicas) as parts:
        held = await shared_between(nats_url, 2)
        assert sorted(held.values()) == [16, 16]
        # Each node serves every function: its own partitions here, the other's by forwarding.
        # As a platform does, a call refused UNAVAILABLE (the store away while a NATS server dies) is made again.
        survivor = Driver(parts.address("node"), keys=KEYS, clients=6, tag="s", retry_assign=True)
        doomed = Driver(parts.address("node-1"), keys=KEYS, clients=6, tag="d", retry_assign=True)
        loads = [asyncio.create_task(d.run()) for d in (survivor, doomed)]
        await eventually(
            lambda: all({c.key for c in d.calls if c.idle_at} == set(KEYS) for d in (survivor, doomed)), 30
        )
        assert [c.error for d in (survivor, doomed) for c in d.calls if c.error] == []
        if nats_down is not None:
            await nats_down()
        await parts.kill("node-1")
        doomed.stop()
        killed_at = time.monotonic()
        await shared_between(nats_url, 1, seconds=30)
        taken_over_s = time.monotonic() - killed_at
        await eventually(lambda: sum(1 for c in survivor.calls if c.got_at > killed_at + taken_over_s) > 40, 30)
        survivor.stop()
        await asyncio.gather(*loads)
        answered = [c for c in survivor.calls if c.got_at > killed_at]
        print(f"\nnode kill -9: its 16 partitions taken over {taken_over_s:.1f}s after; "
              f"{len(answered)} calls through the survivor answered since")  # fmt: skip
        # Through the survivor, calls for the dead node's partitions waited for the take-over, none failed.
        assert [c.error for c in survivor.calls if c.error] == []
        # The dead node's own callers lost their connection: a clear error, nothing else.
        assert all(c.error.startswith("UNAVAILABLE") for c in doomed.calls if c.error)
        assert (survivor.overlaps(), doomed.overlaps()) == ([], [])
        await check(nats_url, stub, survivor.calls + doomed.calls)


async def test_two_nodes_share_the_work_and_one_takes_over_when_the_other_dies(tmp_path, stub):
    async with NatsServer(tmp_path / "nats") as nats:
        await two_nodes_then_one_dies(nats.url, stub)


async def test_the_same_on_a_three_node_nats_cluster_losing_a_nats_node(tmp_path, stub):
    async with NatsCluster(tmp_path / "cluster") as cluster:
        nats_down = cluster.servers[2].stop
        await two_nodes_then_one_dies(cluster.url, stub, replicas=3, nats_down=lambda: nats_down(kill=True))
        async with connected(cluster.url, "test") as nc:
            info = await nc.jetstream().stream_info("EVENTS")
            assert info.config.num_replicas == 3


async def test_a_component_started_without_replicas_keeps_the_streams_three(tmp_path):
    async with NatsCluster(tmp_path / "cluster") as cluster:
        async with connected(cluster.url, "test") as nc:
            js = nc.jetstream()
            await ensure_stream(js, replicas=3)
            await ensure_stream(js)  # a worker or a node started without --replicas
            assert (await js.stream_info("EVENTS")).config.num_replicas == 3


async def test_nodes_decide_with_the_whole_runs_totals(nats_url):
    """Each node hears the others' totals, so the policy's exchange rate is the run's, not its share's."""
    async with Stack(nats_url) as stack:  # node a, with workers and a platform
        a = stack.controller
        b = Controller(nats_url, get_policy("demo"))
        await b.start()
        try:
            await shared_between(nats_url, 2)
            await both_serve(a, b)
        finally:
            await b.stop()


async def both_serve(a: Controller, b: Controller) -> None:
    for key in KEYS:  # requests on both nodes' partitions, each through whichever node holds it
        reply = await a.call(Assign(key=key, request_id=f"r-{key}", meta=META), 30)
        await a.call(Idle(key=key, request_id=f"r-{key}", instance_id=reply.instance_id, duration_ms=5), 30)
    assert a.ledger.totals.exec_ms > 0 and b.ledger.totals.exec_ms > 0, "both nodes served some"
    await eventually(lambda: a.ledger.others == b.ledger.totals and b.ledger.others == a.ledger.totals, 10)
    assert a.ledger.run_totals() == b.ledger.run_totals()


def test_sharing_the_totals_gives_the_scores_of_one_node():
    dataset = generate("mixed", seed=0, span_ms=20 * 60_000)
    one, split, shared = (
        Simulation(dataset, get_policy("learned"), nodes=n, share_every_ms=every).run().stats()
        for n, every in ((1, 0), (4, 0), (4, 1000))
    )
    assert split.score != one.score, "the split totals did change decisions on this trace"
    assert shared.score == pytest.approx(one.score, abs=0.1)


async def test_a_stop_that_cannot_free_its_leases_still_drops_its_heartbeat(nats_url, caplog):
    """The leases lapse on their own; a heartbeat left behind made the next node count two and take half."""
    first = Controller(nats_url, get_policy("demo"))
    await first.start()
    async with connected(nats_url, "test") as nc:
        await nc.jetstream().delete_key_value(LEASES)  # every lease's delete fails now
    await first.stop()
    assert "could not free the leases of partitions 0-31" in caplog.text
    second = Controller(nats_url, get_policy("demo"))
    await second.start()
    try:
        assert second.serving == set(range(PARTITIONS))
    finally:
        await second.stop()
