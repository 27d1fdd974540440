"""Leases against a real JetStream KV: what a stopping node frees, and what it cannot."""

import asyncio
import contextlib
import os
import signal
from dataclasses import replace

from scaler.controller.leases import LEASES, Leases, holders, live
from scaler.proto.events import Batch, KeptAlive, encode_batch
from scaler.proto.subjects import EVENTS, PARTITIONS, event_subject, partition
from scaler.runtime.bus import Unavailable, connected
from scaler.runtime.natsd import NatsServer
from tests.invariants import snapshots_hold_what_they_claim
from tests.stack import Stack, eventually


async def nothing(_: list[int]) -> None:
    return None


async def test_a_stopping_node_frees_a_lease_renewed_at_a_revision_it_never_learned(nats_url):
    """A renewal stored while its answer was lost (a round cut short, a reply dropped) leaves the node holding a
    stale revision: freeing the lease at it fails, and the lease used to stay taken until its TTL, so the next
    node to start took nothing. It is freed while it still names this node; one another node took is left."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        leases = Leases(nc, "n1", nothing, nothing, ttl_s=60)
        await leases.start()
        assert len(leases.held) == PARTITIONS
        kv = await js.key_value(LEASES)
        await kv.put("p3", b"n1")  # a renewal this node never heard back from
        await kv.put("p5", b"n2")  # ... and one that another node now holds (as after a lapse)
        await leases.stop()
        assert await holders(js) == {5: "n2"}


async def test_renewals_stored_after_their_answers_were_lost_keep_the_partitions(tmp_path):
    """Renewals sent as NATS froze get no answer and are stored on the thaw, at revisions the node never learns.
    Its next renewals were refused (wrong last sequence) and taken for lapses: CI once saw a node drop all 32
    partitions that way, and calls waited for partitions nobody served. A lease that still names the node was
    moved by nobody else: it is renewed at the revision it has, in the same holding; one another node took
    meanwhile is dropped, and a refusal with no renewal unanswered is a lapse as before."""
    async with NatsServer(tmp_path / "nats") as nats, connected(nats.url, "test") as nc:
        js = nc.jetstream()
        dropped: list[int] = []

        async def lost(partitions: list[int]) -> None:
            dropped.extend(partitions)

        leases = Leases(nc, "n1", nothing, lost, ttl_s=60, timeout_s=2.0)  # a renewal sent into the freeze waits 2 s
        await leases.start()
        try:
            kv = await js.key_value(LEASES)
            before, tenure = dict(leases.held), dict(leases.tenure)
            os.kill(nats.proc.pid, signal.SIGSTOP)
            try:
                with contextlib.suppress(TimeoutError, Unavailable):
                    await leases._renew()  # sent, never answered
            finally:
                os.kill(nats.proc.pid, signal.SIGCONT)
            async with asyncio.timeout(10):  # ... and stored on the thaw
                while [p for p in range(PARTITIONS) if (await kv.get(f"p{p}")).revision == before[p]]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            await kv.put("p5", b"n2")  # another node took one meanwhile (as after a lapse)
            await leases.round()
            assert dropped == [5]
            assert sorted(leases.held) == sorted(set(range(PARTITIONS)) - {5})
            assert all(leases.tenure[p] == tenure[p] and leases.fresh(p) for p in leases.held)
            assert all([await leases.confirm(p, tenure[p]) for p in leases.held])
            await kv.put("p3", b"n1")  # moved with no renewal of ours unanswered: not ours to assume
            await leases.round()
            assert dropped == [5, 3]
        finally:
            await leases.stop()


async def test_leases_taken_before_a_failure_in_the_same_round_are_loaded(nats_url):
    """A round takes its partitions' leases one after another. One that fails partway (NATS answering nothing for a
    moment, as a cluster does while it elects leaders after a power loss) used to leave the leases taken before it
    held and renewed, but never loaded: the node then had its share and took no more, and nobody served them."""
    async with connected(nats_url, "test") as nc:
        loaded: list[int] = []

        async def gained(partitions: list[int]) -> None:
            loaded.extend(partitions)

        leases = Leases(nc, "n1", gained, nothing, ttl_s=60)
        await leases.start()
        await leases.give_back(list(range(PARTITIONS)))
        loaded.clear()
        create, calls = leases._leases.create, 0

        async def failing_fifth(key: str, value: bytes) -> int:
            nonlocal calls
            calls += 1
            if calls == 5:
                raise TimeoutError("no answer")
            return await create(key, value)

        leases._leases.create = failing_fifth
        try:
            await leases.round()
        except TimeoutError:
            pass
        assert sorted(leases.held) == [0, 1, 2, 3] and sorted(loaded) == [0, 1, 2, 3]
        await leases.stop()


async def test_a_partition_dropped_and_taken_again_is_loaded_only_once_its_release_is_done(nats_url):
    """A lapsed lease is dropped (`lost`: its commands under way finish, then its functions are forgotten) while
    the lease round goes on, and may take the partition again before the release is done. Loaded meanwhile, the
    state was folded onto what was about to be forgotten, and then forgotten: the node served the partition
    with nothing of its functions. The load waits for the release."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("r1", key="fn"))
        await stack.settled()  # its release and plan stored
        c, p = stack.controller, partition("fn")
        before = c.ledger.states["fn"]
        c.partitions.entered(p)  # a command under way: the release waits for it
        dropping = asyncio.create_task(c.partitions.lost([p]))
        await eventually(lambda: p not in c.serving, 10)
        await c.partitions.gained([p])  # the lease round took it again
        await asyncio.sleep(0.5)  # time for a load that does not wait
        c.partitions.left(p)
        await dropping
        await eventually(lambda: p in c.serving and not c.partitions.loading, 10)
        assert c.ledger.states.get("fn") == before, "the partition is served with its function's state"


async def test_partitions_kept_of_a_load_cancelled_for_others_given_back_are_loaded(nats_url):
    """Partitions gained together are loaded by one load. After a cluster's power loss both nodes' leases and
    heartbeats lapsed; one node, counting itself alone, took every partition, and a round later (the other node
    back) gave half of them back while their load still waited: cancelling it for those cancelled the load of the
    half it kept. Their leases were renewed, nobody served them (scripts/faults.py power-loss-cluster-2 hung)."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("r1", key="fn"))
        await stack.settled()
        c, p = stack.controller, partition("fn")
        q = (p + 1) % PARTITIONS  # the half given back, as one partition
        before = c.ledger.states["fn"]
        c.partitions.entered(q)  # a command under way: the release of q waits for it, and so does the load below
        dropping = asyncio.create_task(c.partitions.lost([p, q]))  # both leases lapsed
        await eventually(lambda: p not in c.serving and q not in c.serving, 10)
        await c.partitions.gained([p, q])  # taken again, together: one load, waiting for the release
        giving = asyncio.create_task(c.partitions.lost([q]))  # over its share a round later: q given back
        await eventually(lambda: q not in c.partitions.loading, 10)
        c.partitions.left(q)
        await asyncio.gather(dropping, giving)
        await eventually(lambda: p in c.serving and not c.partitions.loading, 10)
        assert q not in c.serving
        assert c.ledger.states.get("fn") == before, "the partition kept is served with its function's state"
        await stack.idle(await stack.assign("r2", key="fn"))  # and its commands answered


async def test_a_lease_lost_and_taken_again_confirms_nothing_for_the_holding_before(nats_url):
    """A snapshot asked while the node held a partition can wait (behind another snapshot of it, for a renewal)
    while the lease lapses and the node takes it again and loads it anew. It must not be confirmed then: what the
    node held before is not what it holds now (the fault suite's pause run once found a snapshot of a woken node's
    old state claiming the stream's newest batches). The new holding confirms as before."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        leases = Leases(nc, "n1", nothing, nothing, ttl_s=60)
        await leases.start()
        try:
            p = 7
            first = leases.tenure[p]
            assert await leases.confirm(p, first)
            await leases._drop([p], "the test says its lease lapsed")
            assert not await leases.confirm(p, first)
            await (await js.key_value(LEASES)).delete(f"p{p}")  # lapsed at the server too
            await leases.round()  # taken again
            second = leases.tenure[p]
            assert second != first
            assert not await leases.confirm(p, first), "confirmed a holding of the lease that ended"
            assert await leases.confirm(p, second) and await leases.confirm(p)
        finally:
            await leases.stop()


async def test_a_node_restarted_under_its_name_takes_its_leases_back_and_fences_its_earlier_self(nats_url):
    """An incarnation that died holding leases (no stop, no release) leaves them until they lapse; the next one
    under the same name, which holds the name alone (runtime/identity.py), takes them back in its first round,
    by a compare-and-set on their revision: the earlier one, were it somehow alive, can renew none of them and
    confirms none for a snapshot. A lease another node holds is left to it."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        other = Leases(nc, "n2", nothing, nothing, ttl_s=60)
        await other.start()  # alone: all 32
        await other.give_back(list(range(PARTITIONS // 2, PARTITIONS)))
        dead = Leases(nc, "n1", nothing, nothing, ttl_s=60, reclaim=True)
        await dead.start()
        assert sorted(dead.held) == list(range(PARTITIONS // 2, PARTITIONS))
        await dead._stop_rounds()  # it dies: its leases stay until their TTL (60 s here)
        gained: list[int] = []

        async def loaded(partitions: list[int]) -> None:
            gained.extend(partitions)

        again = Leases(nc, "n1", loaded, nothing, ttl_s=60, reclaim=True)
        await again.start()
        try:
            assert sorted(again.held) == sorted(gained) == list(range(PARTITIONS // 2, PARTITIONS))
            held = await holders(js)
            assert {p for p, n in held.items() if n == "n2"} == set(range(PARTITIONS // 2))
            p = PARTITIONS - 1
            assert not await dead.confirm(p), "the earlier incarnation's revision is stale"
            assert not await dead._renew_one(p)
            assert await again.confirm(p)
        finally:
            await again.stop()
            await other.stop()


async def test_without_its_name_held_a_node_waits_for_its_leases_to_lapse(nats_url):
    """The same restart without `reclaim` (a name not known to be held by this process alone) takes nothing."""
    async with connected(nats_url, "test") as nc:
        dead = Leases(nc, "n1", nothing, nothing, ttl_s=60)
        await dead.start()
        await dead._stop_rounds()
        again = Leases(nc, "n1", nothing, nothing, ttl_s=60)
        await again.start()
        try:
            assert again.held == {}
        finally:
            await again.stop()


async def test_a_release_done_after_its_partition_was_taken_again_snapshots_nothing(nats_url):
    """A lapsed lease is dropped (`lost`): its commands under way finish, then the node is told, and snapshots the
    partition and forgets it. Meanwhile the lease round may take it again (a new holding, whose load waits for the
    release), and another node may have written its functions in between. The release's snapshot is of the holding
    that ended: taken in the new one's name it passed its fence, and claimed the stream's newest batches with the
    state from before the lapse (the fault suite's pause run: partitions 16, 19, 28, twice). It writes nothing."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("r1", key="fn"))
        await stack.settled()
        c, p = stack.controller, partition("fn")
        leases, js = c.partitions.leases, c._nc.jetstream()
        c.snapshots._unsaved[p] += 1  # events no snapshot holds yet (a busy partition): the release snapshots it
        c.partitions.entered(p)  # a command under way: the release waits for it
        dropping = asyncio.create_task(leases._drop([p], "the test says its lease lapsed"))
        await eventually(lambda: p not in c.serving, 10)
        # Another node took the partition meanwhile and wrote its function: a batch the dropped state lacks.
        instance = next(iter(c.ledger.states["fn"].instances))
        late = Batch(
            key="fn",
            at_ms=c.clock.now_ms(),
            cause="another node",
            events=[KeptAlive(at_ms=c.clock.now_ms(), instance_id=instance, until_ms=c.clock.now_ms() + 1)],
        )
        stored = (await js.publish(event_subject("fn"), encode_batch(late), stream=EVENTS)).seq
        await eventually(lambda: c.snapshots.watermark() >= stored, 10)  # the node's look at the stream has seen it
        await (await js.key_value(LEASES)).delete(f"p{p}")  # ... and gave it back: this node takes it again
        await leases.round()
        assert p in leases.held and p in c.partitions.loading
        c.partitions.left(p)  # the release goes on, then the load
        await dropping
        await eventually(lambda: p in c.serving and not c.partitions.loading, 10)
        assert await snapshots_hold_what_they_claim(js) == []
        assert c.ledger.last_seq["fn"] == stored  # and the new holding's load folded it


async def test_the_live_nodes_are_counted_by_their_heartbeats_and_a_stopped_one_at_once(nats_url):
    """Each round counts the heartbeats (the keys of their stream, asked of it): two nodes share the partitions;
    one that stops removes its heartbeat without a trace (a delete marker would be counted as a key until it
    lapsed, 60 s here), so the other's next round counts itself alone and takes them all."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        first = Leases(nc, "n1", nothing, nothing, ttl_s=60)
        second = Leases(nc, "n2", nothing, nothing, ttl_s=60)
        await first.start()
        try:
            assert len(first.held) == PARTITIONS
            await second.start()
            assert sorted(await live(js)) == ["n1", "n2"]
            await first.round()  # gives back above its share
            await second.round()  # takes them
            assert len(first.held) == len(second.held) == PARTITIONS // 2
            assert await first.others() == ["n2"]
            await second.stop()
            assert await live(js) == ["n1"] and await first.others() == []
            await first.round()
            assert len(first.held) == PARTITIONS
        finally:
            await first.stop()
            await second.stop()


async def test_a_round_renews_every_lease_in_one_batch_and_each_alone_once_that_is_refused(nats_url):
    """A renewal per partition was 32 synced writes and acks a second, much of an idle node's work and of its
    nats-server's: a round's renewals are one atomic batch of compare-and-sets, answered once. A batch is all or
    nothing, and a refused one does not say which lease moved: each is then renewed on its own in the same round,
    the one another node took dropped, the others kept in the same holding."""
    async with connected(nats_url, "test") as nc:
        dropped: list[int] = []

        async def lost(partitions: list[int]) -> None:
            dropped.extend(partitions)

        leases = Leases(nc, "n1", nothing, lost, ttl_s=60, every_s=600)  # no round but the test's
        await leases.start()
        try:
            kv = await nc.jetstream().key_value(LEASES)
            before, tenure = dict(leases.held), dict(leases.tenure)
            answers = nc.stats["in_msgs"]
            await leases._renew()
            assert nc.stats["in_msgs"] - answers == 1, "one answer for the round's renewals"
            assert all(leases.held[p] > before[p] for p in range(PARTITIONS))
            stored = {p: (await kv.get(f"p{p}")).revision for p in range(PARTITIONS)}
            assert stored == leases.held
            await kv.put("p5", b"n2")  # another node took one (as after a lapse): the batch is refused
            before = dict(leases.held)
            await leases._renew()
            assert dropped == [5]
            assert sorted(leases.held) == sorted(set(range(PARTITIONS)) - {5})
            assert all(leases.held[p] > before[p] and leases.fresh(p) for p in leases.held)
            assert all(leases.tenure[p] == tenure[p] for p in leases.held)
            assert (await kv.get("p5")).value == b"n2"
        finally:
            await leases.stop()


async def test_a_bucket_that_stops_taking_batches_has_its_leases_renewed_one_by_one(nats_url):
    """A batch refused for another reason than a moved lease (the bucket's stream changed by hand to take no atomic
    batch, or a server in the cluster that does not) must not fail every round until the leases lapse: the round
    renews each lease on its own, as on a server before 2.12."""
    async with connected(nats_url, "test") as nc:
        leases = Leases(nc, "n1", nothing, nothing, ttl_s=60, every_s=600)
        await leases.start()
        try:
            js = nc.jetstream()
            config = (await js.stream_info(f"KV_{LEASES}")).config
            await js.update_stream(replace(config, allow_atomic=False))
            before = dict(leases.held)
            await leases._renew()
            assert sorted(leases.held) == list(range(PARTITIONS))
            assert all(leases.held[p] > before[p] and leases.fresh(p) for p in range(PARTITIONS))
        finally:
            await leases.stop()
