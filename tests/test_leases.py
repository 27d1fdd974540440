"""Leases against a real JetStream KV: what a stopping node frees, and what it cannot."""

from controller.leases import LEASES, Leases, holders
from proto.subjects import PARTITIONS
from runtime.bus import connected


async def nothing(_: list[int]) -> None:
    return None


async def test_a_stopping_node_frees_a_lease_renewed_at_a_revision_it_never_learned(nats_url):
    """A renewal stored while its answer was lost (a round cut short, a reply dropped) leaves the node holding a
    stale revision: freeing the lease at it fails, and the lease used to stay taken until its TTL, so the next
    node to start took nothing. It is freed while it still names this node; one another node took is left."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        leases = Leases(js, "n1", nothing, nothing, ttl_s=60)
        await leases.start()
        assert len(leases.held) == PARTITIONS
        kv = await js.key_value(LEASES)
        await kv.put("p3", b"n1")  # a renewal this node never heard back from
        await kv.put("p5", b"n2")  # ... and one that another node now holds (as after a lapse)
        await leases.stop()
        assert await holders(js) == {5: "n2"}
