"""An upgrade keeps every snapshot: a store written by an earlier version, whose stream retention has emptied,
loads into this one (tests/fixtures/upgrade: one store per state version, never rewritten)."""

import hashlib
import tarfile
from pathlib import Path

import msgspec
import pytest

from scaler.controller import rebuild
from scaler.controller.core import state
from scaler.controller.ledger import Ledger
from scaler.controller.shell import Controller
from scaler.controller.snapshots import SnapshotStore, _Lifecycle
from scaler.proto.subjects import PARTITIONS
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.store import stream
from tests.controller.test_snapshots import DEMO
from tests.fixtures.upgrade.make import summary

FIXTURES = Path(__file__).parents[1] / "fixtures" / "upgrade"
# What a snapshot stores, by state version: another shape needs another version (and its upcast). Until version
# 12, the whole snapshot's schema (`snapshots.Snapshot`), the features in it.
SCHEMAS = {
    2: "5d6b0173f6ee4414",
    3: "fdf152dac07fcc8e",
    4: "88d80e17d51405a5",
    5: "a287220797df945c",
    6: "f6d04cc3fc9ef838",
    7: "271782d0db308d39",
    8: "93c632b1d4c0ec26",
    9: "275276e0eb9b38e3",
    10: "275276e0eb9b38e3",  # ClockRebased: the same shape, a new event in the fold
    11: "9975b7d96cc655c9",  # the features beside the states, not in them
    12: "04aeaf2cc6f33f62",  # an exchange rate in the limits an operator sets
}
# From version 12 on, the lifecycle body alone (`snapshots._Lifecycle`): the features beside it are pinned by
# their own version (features.VERSION and tests/fixtures/features), and a new feature bumps only that one.
LIFECYCLES = {12: "cc929ca830ee9f0d", 13: "cc929ca830ee9f0d"}  # 13: the same shape, slot time from 0
RELEASES = sorted(p.name.removeprefix("store-").removesuffix(".tar.gz") for p in FIXTURES.glob("store-*.tar.gz"))


@pytest.mark.parametrize("release", RELEASES)
async def test_a_store_written_by_an_earlier_version_loads_from_its_snapshots(release, tmp_path):
    with tarfile.open(FIXTURES / f"store-{release}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    expected = msgspec.json.decode((FIXTURES / f"expected-{release}.json").read_bytes())
    async with NatsServer(tmp_path / "nats") as server:
        async with connected(server.url, "test") as nc:
            js = nc.jetstream()
            at = await stream.kept(js)
            assert at.truncated and at.first_seq > at.last_seq  # every batch gone: only the snapshots hold them
            store = SnapshotStore(js)
            await store.open(create=False)
            ledger = Ledger()
            rebuild.restore(ledger, await rebuild.snapshots(store, at, range(PARTITIONS)))
            assert summary(ledger.states, ledger.features) == expected
        node = Controller(server.url, DEMO)
        try:
            ready = await node.start()
            assert len(node.serving) == PARTITIONS and "0 batches read" in ready, ready
        finally:
            await node.stop()


def test_what_a_snapshot_stores_is_pinned_to_the_state_version():
    schema = hashlib.sha256(msgspec.json.encode(msgspec.json.schema(_Lifecycle))).hexdigest()[:16]
    assert LIFECYCLES.get(state.VERSION) == schema, (
        "what a snapshot stores changed: bump scaler.controller.core.state.VERSION,"
        " add its step to scaler/controller/upcasts.py,"
        f" pin {schema} here, and write that version's store (python -m tests.fixtures.upgrade.make v{state.VERSION})"
    )
