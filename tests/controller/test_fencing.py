"""Fencing on real processes: a node paused (SIGSTOP) past its lease while two nodes serve under load comes back
knowing it lost its partitions, says so once, and decides, answers and snapshots nothing for them."""

import asyncio
import os
import signal
import time

import pytest

from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from tests.invariants import snapshots_hold_what_they_claim
from tests.processes import Driver, Parts, controller_state
from tests.stack import eventually
from tests.system.test_nodes import KEYS, check, shared_between

FENCED = "no longer decides for partitions"


async def all_served(nats_url: str, seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if set(KEYS) <= set((await controller_state(nats_url)).states):
                return
            await asyncio.sleep(0.2)


@pytest.fixture
def stub(challenge_stub):
    return challenge_stub


async def test_a_node_paused_past_its_lease_comes_back_fenced(tmp_path, stub, capfd):
    async with NatsServer(tmp_path / "nats") as nats, Parts(nats.url, f"127.0.0.1:{stub.port}", nodes=2) as parts:
        await shared_between(nats.url, 2)
        # Callers on both nodes; those of the paused one wait and retry (same request id), as a platform does.
        callers = [Driver(parts.address(n), keys=KEYS, clients=6, tag=n, retry_assign=True) for n in parts.nodes]
        loads = [asyncio.create_task(d.run()) for d in callers]
        await eventually(lambda: all({c.key for c in d.calls if c.idle_at} == set(KEYS) for d in callers), 30)
        paused = parts.running["node-1"].proc.pid
        os.kill(paused, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            await shared_between(nats.url, 1, seconds=30)  # its leases lapsed; the other node took them
            await eventually(lambda: sum(1 for c in callers[0].calls if c.got_at > paused_at + 6) > 20, 60)
        finally:
            os.kill(paused, signal.SIGCONT)
        await shared_between(nats.url, 2, seconds=30)  # back, and given its share anew
        woke_at = time.monotonic()
        await eventually(lambda: all(sum(1 for c in d.calls if c.got_at > woke_at) > 20 for d in callers), 30)
        for d in callers:
            d.stop()
        await asyncio.gather(*loads)
        await all_served(nats.url)  # the partitions the woken node was given back are loaded, not only leased
        calls = [c for d in callers for c in d.calls]
        assert [c.error for c in calls if c.error] == []
        assert all(d.overlaps() == [] for d in callers)
        await check(nats.url, stub, calls)  # each request assigned once, no slot leaked, replay == state
        async with connected(nats.url, "test") as nc:
            assert await snapshots_hold_what_they_claim(nc.jetstream()) == []
    said = capfd.readouterr().err
    assert said.count(FENCED) == 1, said[-3000:]
