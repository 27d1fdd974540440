"""Tenants' quotas set while running (scaler/controller/tenants.py) on a real nats-server: the node that takes a
change tells the others, who hold it at once; a change nobody told of is read at the next regular read."""

import msgspec
import nats

from scaler.controller import tenants
from scaler.controller.core.limits import TenantQuota
from scaler.controller.tenants import BUCKET, TenantQuotas
from tests.controller.test_seeds_ledger import Node
from tests.stack import eventually

WAIT_S = 30.0  # for what is due: a loaded machine is slow, not wrong


async def test_a_quota_set_on_one_node_is_held_by_the_others_when_told(nats_url, monkeypatch):
    monkeypatch.setattr(tenants, "READ_EVERY_S", 600.0)  # no regular read during the test: only the word tells
    one, other = await nats.connect(nats_url), await nats.connect(nats_url)
    a, b = Node(), Node()
    here, there = TenantQuotas(one, a.ledger, replicas=1), TenantQuotas(other, b.ledger, replicas=1)
    await here.start()
    await there.start()
    try:
        quota = TenantQuota(max_on_demand=2)
        await here.set("acme", quota)
        assert a.ledger.quotas == {"acme": quota}  # the node that took it: before it answers
        await eventually(lambda: b.ledger.quotas == {"acme": quota}, WAIT_S)
        await here.set("acme", None)  # the limits file's again
        await eventually(lambda: b.ledger.quotas == {}, WAIT_S)
    finally:
        for part in (here, there):
            await part.stop()
        for nc in (one, other):
            await nc.close()


async def test_a_quota_changed_in_the_bucket_by_hand_is_read_at_the_next_regular_read(nats_url, monkeypatch):
    monkeypatch.setattr(tenants, "READ_EVERY_S", 0.2)
    nc = await nats.connect(nats_url)
    node = Node()
    quotas = TenantQuotas(nc, node.ledger, replicas=1)
    await quotas.start()
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        await kv.put("shop", msgspec.msgpack.encode(TenantQuota(max_reserved=1)))  # `nats kv put`: nobody told
        await eventually(lambda: node.ledger.quotas == {"shop": TenantQuota(max_reserved=1)}, WAIT_S)
    finally:
        await quotas.stop()
        await nc.close()
