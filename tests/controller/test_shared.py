"""The run's totals across nodes (scaler/controller/shared.py) on a real nats-server: a node tells the others its
totals at each exchange and its tenants' counts when they change, woken by its ledger, and says nothing between
its exchanges when they do not; the others count what it told until it stops or falls silent."""

import asyncio

import msgspec
import nats

from scaler.controller.core.totals import Totals
from scaler.controller.shared import HELD, SharedTotals, TenantsHeld
from scaler.runtime.tasks import cancelled
from tests.controller.test_seeds_ledger import Node, served
from tests.stack import eventually

EXCHANGE_S = 600.0  # no exchange during the test but the first: every word heard after it was told on a change
WAIT_S = 30.0  # for a word that is due: a loaded machine is slow, not wrong


async def test_a_tenants_count_is_told_when_it_changes_and_nothing_is_told_when_it_does_not(nats_url):
    nc = await nats.connect(nats_url)
    heard: asyncio.Queue[TenantsHeld] = asyncio.Queue()
    decode = msgspec.msgpack.Decoder(TenantsHeld).decode

    async def hear(msg) -> None:
        heard.put_nowait(decode(msg.data))

    sub = await nc.subscribe(HELD, cb=hear)
    node = Node()
    shared = SharedTotals(nc, "n1", node.ledger, ttl_s=4.0, every_s=EXCHANGE_S)
    await shared.start()
    try:
        first = await asyncio.wait_for(heard.get(), WAIT_S)  # the first exchange's word: nothing held yet
        assert first.node == "n1" and first.tenants == {}

        served(node, "a", 0, "f1", tenant="acme")  # the tenant's first instance: its count moved
        told = await asyncio.wait_for(heard.get(), WAIT_S)
        assert told.tenants["acme"].on_demand == 1, told

        served(node, "b", 10, "f2")  # a function of no tenant: no tenant's count moved
        await asyncio.sleep(0.3)
        assert heard.empty(), heard.get_nowait()

        served(node, "c", 20, "f3", tenant="acme")
        told = await asyncio.wait_for(heard.get(), WAIT_S)
        assert told.tenants["acme"].on_demand == 2, told
    finally:
        await shared.stop()
        await sub.unsubscribe()
        await nc.close()


async def test_a_nodes_totals_are_counted_by_the_others_until_it_stops_or_falls_silent(nats_url):
    """A node stopping says it counts nothing; one killed or cut off is forgotten `ttl_s` after its last word, as
    its entry in a bucket with that TTL was."""
    nc = await nats.connect(nats_url)
    a, b, c = Node(), Node(), Node()
    served(b, "r1", 0, "f1", tenant="acme")
    served(c, "r2", 0, "f2")
    ours = SharedTotals(nc, "a", a.ledger, ttl_s=2.0, every_s=0.2)
    stopped = SharedTotals(nc, "b", b.ledger, ttl_s=2.0, every_s=0.2)
    silent = SharedTotals(nc, "c", c.ledger, ttl_s=2.0, every_s=0.2)
    for shared in (ours, stopped, silent):
        await shared.start()
    try:
        both = b.ledger.totals.plus(c.ledger.totals)
        await eventually(lambda: a.ledger.others == both, WAIT_S)
        assert a.ledger.others.tenants["acme"].on_demand == 1 and a.ledger.others.instances == 2
        await stopped.stop()  # says so: counted as nothing at once
        await eventually(lambda: a.ledger.others == c.ledger.totals, WAIT_S)
        await cancelled(silent._task)  # it says nothing more: killed, or cut off
        await eventually(lambda: a.ledger.others == Totals(), WAIT_S)  # forgotten ttl_s after its last word
    finally:
        await ours.stop()
        await silent.stop()
        await nc.close()
