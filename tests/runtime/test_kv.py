"""Listing a KV bucket's keys against a real JetStream: every key, and nothing left behind on the server."""

import asyncio

import pytest
from nats.js.api import KeyValueConfig
from nats.js.errors import NotFoundError

from scaler.runtime.bus import connected
from scaler.runtime.kv import entries
from tests.certs import Authority
from tests.secured import Secured


async def test_listing_a_buckets_keys_leaves_no_consumer_behind(nats_url):
    """nats-py's KeyValue.keys() leaves its consumer on the server for 5 minutes. The leases' nodes and the
    run's totals are listed every second, and nats-server 2.15 caps a stream at 1,000 consumers: four nodes
    passed it and their listings failed. A listing's consumer goes once nothing reads it."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket="listed"))
        assert await entries(js, "listed") == {}
        for key in "abc":
            await kv.put(key, key.encode())
        await kv.delete("c")
        for _ in range(20):
            assert await entries(js, "listed") == {"a": b"a", "b": b"b"}
        async with asyncio.timeout(60):  # the server drops them within seconds; 60 s for a loaded machine
            while True:
                if not (await js.stream_info("KV_listed")).state.consumer_count:
                    return
                await asyncio.sleep(0.5)


async def test_listing_a_bucket_that_does_not_exist_says_so(nats_url):
    """`scaler.controller.leases.holders` takes NotFoundError for "no node has started yet" (no lease bucket)."""
    async with connected(nats_url, "test") as nc:
        with pytest.raises(NotFoundError):
            await entries(nc.jetstream(), "never_made")


async def test_a_listing_has_every_key_even_when_the_server_sends_them_all_at_once(nats_url):
    """nats-py's watcher, which its keys() reads, may say "no more" before handling the first entry when the
    server has sent them all already: 32 leases listed as none, and the state service then waited for no
    node. Every listing here must have every key, while a writer keeps replacing some of them."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket="leases", history=1))
        keys = [f"p{n}" for n in range(32)]
        for key in keys:
            await kv.put(key, b"node")

        async def renew() -> None:
            while True:
                for key in keys[::3]:
                    await kv.put(key, b"node")
                await asyncio.sleep(0)

        renewing = asyncio.create_task(renew())
        try:
            for _ in range(100):
                assert sorted(await entries(js, "leases")) == sorted(keys)
        finally:
            renewing.cancel()


async def test_a_listing_rides_through_the_server_reading_its_configuration_again(tmp_path):
    """nats-server makes its accounts again on SIGHUP (new certificates, under deploy/nats.conf), and for a moment
    JetStream's API has no responder: a listing of the leases then failed an Admin List while an operator rotated
    certificates (tests/system/test_rotation.py). Every listing here is whole, whenever the reload comes."""
    async with Secured(tmp_path, Authority(tmp_path / "ca")) as server, connected(server.access("node"), "test") as nc:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket="scaler_leases"))
        await kv.put("p0", b"node")
        reloading = True

        async def reload() -> None:
            nonlocal reloading
            for _ in range(20):
                server.server.reload()
                await asyncio.sleep(0.3)
            reloading = False

        reloads = asyncio.create_task(reload())
        listed = 0
        try:
            while reloading:
                assert await entries(js, "scaler_leases") == {"p0": b"node"}
                listed += 1
                await asyncio.sleep(0.005)  # each listing's consumer stays 2 s: well under the server's 1,000
        finally:
            reloads.cancel()
        assert listed > 20, listed  # listed all along, not once before the reloads and once after
