"""A stream that goes backwards under a running node is a loss, not retention: an older copy of the NATS store put
under it (its tail lost) raises the alarm once (a log line, the metric), its partitions are reloaded from the
stream and reconciled with the platform, and what it writes after holds: no snapshot skips a reused sequence."""

import asyncio
import logging
import shutil

from nats.errors import Error as NatsError

from scaler.controller.leases import ranges
from scaler.proto.commands import Code, SlotReady, decode_reply, encode
from scaler.proto.subjects import PARTITIONS, command_subject
from scaler.runtime.bus import connected, send
from scaler.runtime.natsd import NatsServer
from tests.controller.test_snapshots import full_replay, some_traffic
from tests.invariants import snapshots_hold_what_they_claim
from tests.stack import Stack, eventually

ALARM = "EVENTS lost batches"


async def same_as_replay(node, nats_url: str, seconds: float = 20) -> None:
    """Wait until the node serves every partition with the state a replay of the stream gives. Its leases came
    back older with the store, so they lapse and are taken again too: the node may reload twice."""
    async with asyncio.timeout(seconds):
        while True:
            if len(node.serving) == PARTITIONS and node.states == await full_replay(nats_url):
                return
            await asyncio.sleep(0.2)


async def test_an_older_copy_of_the_store_under_a_running_node_is_an_alarm_and_a_reload(tmp_path, caplog):
    store, older = tmp_path / "nats", tmp_path / "older"
    nats = NatsServer(store)
    await nats.start()
    try:
        async with Stack(nats.url, reconcile_grace_s=5.0) as stack:
            node = stack.controller
            await some_traffic(stack, "a")
            await nats.stop()
            shutil.copytree(store, older)
            await nats.start()
            await some_traffic(stack, "b")  # the tail about to be lost: batches, and slots on the platform
            await asyncio.sleep(5.5)  # its slots older than the reconcile's grace: not taken for ones in flight
            await nats.stop()
            shutil.rmtree(store)
            shutil.copytree(older, store)
            with caplog.at_level(logging.ERROR, logger="scaler"):
                await nats.start()
                await eventually(lambda: getattr(node, "losses", 0) == 1, 20)
                # Reconciled: the slots made for the lost tail's instances are destroyed, none leaked.
                await eventually(lambda: set(stack.stub.accounting.live) == set(stack.live_instances().values()), 20)
                await stack.settled()
                await same_as_replay(node, nats.url)
                await some_traffic(stack, "c")  # sequences the lost tail had used are used again
                assert node.states == await full_replay(nats.url)
            alarms = [r.getMessage() for r in caplog.records if ALARM in r.getMessage()]
            assert len(alarms) == 1, alarms
            assert getattr(node, "losses", 0) == 1
        async with connected(nats.url, "test") as nc:  # the stop's snapshots, and every earlier one, hold
            assert await snapshots_hold_what_they_claim(nc.jetstream()) == []
    finally:
        await nats.stop()


async def test_a_report_that_decides_nothing_is_checked_against_the_store_before_it_is_answered(tmp_path):
    """Issue 41, item 1: a worker's report the node's state already holds decides nothing and appends nothing, so
    no order check saw that the stream had lost it; it was answered (acked, never sent again) on a state the
    stream no longer held, and the instance stayed *creating* there. Here nothing else looks (the guard and the
    lease rounds slowed to minutes): the report's own read of its function's stream must find the loss."""
    store, older = tmp_path / "nats", tmp_path / "older"
    nats = NatsServer(store)
    await nats.start()
    try:
        async with Stack(nats.url, guard_every_s=3600, lease_ttl_s=240, lease_every_s=60) as stack:
            node = stack.controller
            await stack.idle(await stack.assign("a1", key="fa"))
            await stack.settled()
            await nats.stop()
            shutil.copytree(store, older)
            await nats.start()
            await stack.idle(await stack.assign("b1", key="fb"))  # the tail about to be lost: fb's instance
            await stack.settled()
            (made,) = node.states["fb"].instances.values()
            await nats.stop()
            shutil.rmtree(store)
            shutil.copytree(older, store)
            await nats.start()
            again = SlotReady(key="fb", instance_id=made.id, slot_id=made.slot_id, create_ms=1, init_ms=1)
            async with connected(nats.url, "test") as nc:
                async with asyncio.timeout(20):
                    while True:  # until the node is connected again
                        try:
                            msg = await nc.request(command_subject("fb"), encode(again), timeout=2)
                            break
                        except (NatsError, TimeoutError):
                            await asyncio.sleep(0.1)
                first = decode_reply(msg.data)
                assert first.code is Code.UNAVAILABLE, first  # not acked on a state the stream lost
                await eventually(lambda: getattr(node, "losses", 0) == 1, 20)
                assert (await send(nc, again, patience_s=30)).code is Code.OK  # the report sent again, on the reload
            # Decided on the stream as it is: a slot nothing there wanted, destroyed rather than leaked.
            await eventually(lambda: made.slot_id not in stack.stub.accounting.live, 20)
            await stack.settled()
            await same_as_replay(node, nats.url)
    finally:
        await nats.stop()


def test_partition_ranges_read_as_written_and_none_for_no_partition():
    """The loss alarm names the partitions it reloads: a node whose leases all lapsed with the store serves none
    (the lost-tail fault), and the alarm failed on the empty list and was never said."""
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert ranges([]) == "none"
