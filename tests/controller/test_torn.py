"""A snapshot that cannot be read (a write cut short) is ignored: the partition is read from the stream while it
still begins at its first batch, and refused with one clear line once retention has cut it."""

import asyncio

from scaler.controller.shell import Controller
from scaler.proto.subjects import PARTITIONS, partition
from scaler.runtime.bus import connected
from tests.controller.test_snapshots import DEMO, full_replay, some_traffic
from tests.nemesis import tear_snapshot
from tests.stack import Stack


async def test_a_torn_or_cut_snapshot_is_ignored_and_its_partition_read_from_the_stream(nats_url):
    async with Stack(nats_url) as stack:
        await some_traffic(stack, "a")
    torn, dropped = partition("fn0"), partition("fn1")
    async with connected(nats_url, "test") as nc:
        await tear_snapshot(nc.jetstream(), torn)
        await tear_snapshot(nc.jetstream(), dropped, drop=True)
    node = Controller(nats_url, DEMO)
    try:
        async with asyncio.timeout(30):
            await node.start()
        assert len(node.serving) == PARTITIONS
        assert node.states == await full_replay(nats_url)
        assert node.loaded_batches > 0  # the torn partitions' batches, from the stream
    finally:
        await node.stop()
