"""Listing a JetStream KV bucket: every entry, and without leaving a consumer behind.

nats-py's `KeyValue.keys()` (and its `watchall()`, which it reads through) has two faults here:
- It may end before the first key: the watcher says "nothing more" when the server's count of what
  is left is 0 and its callback has handled nothing yet, but the server may have sent every entry
  already, still queued in the client (nats-py issue 842, PR 995). A listing of a bucket of 32
  leases came back empty that way, and the state service then waited for no node.
- Its consumer stays on the server 5 minutes after the listing. A bucket listed every second would
  hold about 300 consumers for each node that lists it, and nats-server
  2.15 caps a stream at 1,000 consumers unless the stream says otherwise.

So a listing here pulls: the consumer is made first, and its creation says how many entries it
starts with (the last of each key; a pull consumer has sent none yet), and the listing reads that
many. An entry replaced meanwhile is read in its new version (the old one is gone: a bucket keeps
one per key); one removed with nothing in its place (its TTL ran out) ends the listing early, when
the server says nothing is left. The values come with the keys, so no caller gets each key again.

JetStream's API asked for the listing's consumer and its count is asked again while it cannot answer (`answered`:
a server reading its configuration again has for a moment no responder for it), within the listing's own wait:
an Admin call lists the leases, and an operator rotating certificates must not fail it.
"""

import asyncio

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import ServiceUnavailableError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from scaler.runtime.bus import answered

LISTING_INACTIVE_S = 2.0  # how long the server keeps a listing's consumer once nothing reads it
LISTING_WAIT_S = 5.0  # the longest a listing waits for the next keys
_BATCH = 256
_PAUSE_S = 0.05  # between asks JetStream's API could not answer


async def entries(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    """The bucket's keys and values, deleted ones left out; {} when it holds none. Raises NotFoundError when
    there is no such bucket, and TimeoutError (a failover: its consumer's server died) when the next entries
    do not come within LISTING_WAIT_S, refused pulls included."""
    return {key: value for key, (value, _) in (await entries_at(js, bucket)).items()}


async def entries_at(js: JetStreamContext, bucket: str) -> dict[str, tuple[bytes, float]]:
    """As `entries`, each value with when it was written (Unix seconds, the server's clock): a lease's renewal."""
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=api.AckPolicy.NONE,
        mem_storage=True,
        inactive_threshold=LISTING_INACTIVE_S,
        filter_subject=f"{prefix}>",
    )
    made = await answered(lambda: js.add_consumer(stream, config), LISTING_WAIT_S, _PAUSE_S)
    expected = made.num_pending  # a pull consumer sends nothing before it is asked
    sub = await js.pull_subscribe_bind(consumer=made.name, stream=stream)
    try:
        found: dict[str, tuple[bytes, float] | None] = {}  # None: deleted
        read, loop = 0, asyncio.get_running_loop()
        until = loop.time() + LISTING_WAIT_S  # moved on by every key that comes
        while read < expected:
            msgs = []
            try:
                msgs = await sub.fetch(min(expected - read, _BATCH), timeout=max(until - loop.time(), 0.1))
            except nats.errors.TimeoutError:
                pass
            except ServiceUnavailableError:  # on a cluster a consumer just made may not take pulls yet
                await asyncio.sleep(0.05)
                if loop.time() < until:
                    continue
            read += len(msgs)
            for msg in msgs:
                op = msg.headers.get(KV_OP) if msg.headers else None
                written = msg.metadata.timestamp.timestamp()
                found[msg.subject.removeprefix(prefix)] = None if op in (KV_DEL, KV_PURGE) else (msg.data, written)
            if msgs:
                until = loop.time() + LISTING_WAIT_S
            if not msgs or msgs[-1].metadata.num_pending == 0:
                left = await answered(sub.consumer_info, max(until - loop.time(), _PAUSE_S), _PAUSE_S)
                if left.num_pending == 0:  # some expired meanwhile: all there is was read
                    break
                if loop.time() >= until:
                    raise TimeoutError(f"listing {bucket}: no key came in {LISTING_WAIT_S:g}s")
        return {k: v for k, v in found.items() if v is not None}
    finally:
        await sub.unsubscribe()
