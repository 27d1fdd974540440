"""Listing a JetStream KV bucket's keys without leaving a consumer behind.

nats-py's `KeyValue.keys()` reads the keys through an ephemeral consumer that the server keeps for
5 minutes after the listing ends. Listed every second (the leases' nodes, the run's totals), that is
about 300 consumers per bucket for each node, and nats-server 2.15 caps a stream at 1,000 consumers
unless the stream says otherwise: on four nodes the listings, and so the leases and the totals, fail
with "maximum consumers limit reached".
"""

from nats.js.kv import KeyValue

LISTING_INACTIVE_S = 2.0  # how long the server keeps a listing's consumer once nothing reads it
LISTING_WAIT_S = 5.0  # the longest a listing waits for the next key


async def list_keys(kv: KeyValue) -> list[str]:
    """The bucket's keys, deleted ones left out; [] when it holds none."""
    watcher = await kv.watchall(ignore_deletes=True, meta_only=True, inactive_threshold=LISTING_INACTIVE_S)
    try:
        found = []
        # None: the end of what the bucket held when the listing began. A listing that hears nothing for
        # LISTING_WAIT_S fails as a request does (its consumer's server may have died: a failover).
        while (entry := await watcher.updates(timeout=LISTING_WAIT_S)) is not None:
            found.append(entry.key)
        return found
    finally:
        await watcher.stop()
