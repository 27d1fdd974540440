"""The command path: an Idle answered before its release is stored, nothing handed out on it before that, the
plan stored after the replies; on a real nats-server, with the store's appends held back where a test says."""

import asyncio
import os
import signal

import grpc

from scaler import replay
from scaler.controller.core.state import Phase
from scaler.controller.ledger import PLAN, Ledger
from scaler.controller.path import door, lane, lanes
from scaler.controller.path.admission import Admission
from scaler.controller.path.lane import Lane
from scaler.controller.path.lanes import Lanes, Told
from scaler.controller.path.replies import Replies
from scaler.controller.path.timers import Timers
from scaler.controller.snapshots import SnapshotStore
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto.commands import Code, Idle, SlotDestroyed, Tick
from scaler.proto.events import Assigned, KeptAlive, Released, decode_batch
from scaler.proto.subjects import function_events, partition
from scaler.runtime.bus import Unavailable, connected
from scaler.runtime.clock import Clock
from scaler.runtime.natsd import NatsServer
from scaler.store import stream
from tests.invariants import snapshots_hold_what_they_claim
from tests.stack import Stack, eventually


class Held:
    """The store's appends of batches holding an event of `kind`, held until `release()` (or failed once)."""

    def __init__(self, stack: Stack, kind: type, fail_once: bool = False) -> None:
        self.events = stack.controller.writer.store
        self.real = self.events.append
        self.kind = kind
        self.fail_once = fail_once
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()
        self.events.append = self.append

    async def append(self, a):
        if any(isinstance(e, self.kind) for e in decode_batch(a.data).events):
            self.reached.set()
            if self.fail_once:
                self.fail_once = False
                raise Unavailable("event store unavailable: held by the test")
            await self.gate.wait()
        return await self.real(a)

    def release(self) -> None:
        self.gate.set()


async def causes(nats_url: str, key: str = "fn", seqs: bool = False) -> list[tuple]:
    """Each stored decision of `key`: its cause and its events' kinds (and first the message's sequence)."""
    found: list[tuple] = []

    def each(seq: int, b) -> None:
        found.extend(((seq,) if seqs else ()) + (d.cause, [type(e).__name__ for e in d.events]) for d in b.decisions())

    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), each, function_events(key))
    return found


async def test_an_idle_is_answered_while_its_release_is_stored_and_nothing_is_handed_out_on_it_before(nats_url):
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        held = Held(stack, Released)
        answer = await stack.idle(first)  # answered although its batch cannot be stored yet
        assert answer.status == pb.Ok and held.reached.is_set() and not held.gate.is_set()
        assert stack.controller.states["fn"].instances["fn-1"].phase is Phase.BUSY  # not stored: not applied
        second = asyncio.create_task(stack.assign("r2"))  # would take the instance the Idle freed
        done, _ = await asyncio.wait({second}, timeout=0.5)
        assert not done, "handed out an instance on a release that is not stored"
        held.release()
        assert (await second).assigment.instance_id == "fn-1"
        await stack.settled()
        stored = [cause for cause, _ in await causes(nats_url)]
        assert stored.index("idle:r1") < stored.index("assign:r2")


async def test_an_idles_plan_rides_in_its_releases_batch_and_an_assigns_follows_its_reply(nats_url):
    """One append a call: the Idle's caller has its answer before anything is stored, so the plan that keeps the
    freed instance alive is decided after the release and stored with it, one message; an Assign's caller waits
    for the storage, so its group is stored without a plan (one follows, only when it changes something)."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("r1"))
        await stack.settled()
        await stack.idle(await stack.assign("r2"))  # warm
        await stack.settled()
        found = await causes(nats_url, seqs=True)
        release = next(i for i, (_, cause, _) in enumerate(found) if cause == "idle:r1")
        assert found[release][1:] == ("idle:r1", ["Released"])  # the reply's decision
        assert found[release + 1][1:] == (PLAN, ["KeptAlive"])  # then the keep-alive, as the plan
        assert found[release][0] == found[release + 1][0], "the release and its plan are one message"
        warm = next(i for i, (_, cause, _) in enumerate(found) if cause == "assign:r2")
        assert found[warm][1:] == ("assign:r2", ["RequestArrived", "Assigned"])
        assert found[warm + 1][1] == "idle:r2", "a warm Assign's plan changes nothing: nothing more is stored"
        assert len({seq for seq, _, _ in found[warm:]}) == 2, "a warm Assign and its Idle: two appends"
        kept = stack.controller.states["fn"].instances["fn-1"]
        assert kept.phase is Phase.IDLE and kept.keep_until_ms > 0


async def test_a_warm_assign_is_answered_before_its_functions_plan_is_decided(nats_url):
    """Planning is beside the reply path: once a group is stored its callers run on (the gateway sends a warm
    Assign's answer) before the function's plan is decided, rather than after that decision's CPU."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("r1"))
        await stack.settled()
        controller, answered, seen = stack.controller, set(), []
        call, plan = controller.door.call, controller.ledger.plan

        async def calling(cmd, timeout_s):
            reply = await call(cmd, timeout_s)
            answered.add(cmd.request_id)
            return reply

        def planning(key, *args, **kw):
            seen.append(key == "fn" and "r2" in answered)
            return plan(key, *args, **kw)

        controller.door.call, controller.ledger.plan = calling, planning
        assert (await stack.assign("r2")).assigment.instance_id == "fn-1"  # warm
        await stack.settled()
    assert seen[:1] == [True], "the function's plan was decided before the warm Assign's caller had its answer"


async def test_a_partition_given_up_waits_for_a_plan_under_way_so_its_snapshot_holds_it(nats_url):
    """The plan is appended after the replies, when no command of the partition is under way any more; a
    hand-over (drain, stop) that snapshotted then would leave the plan's batch behind its snapshot."""
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        held = Held(stack, KeptAlive)
        await stack.idle(first)
        await held.reached.wait()  # the Idle decided and stored; its plan's append under way
        partitions = stack.controller.partitions
        given = asyncio.create_task(partitions.leases.give_back([partition("fn")]))
        done, _ = await asyncio.wait({given}, timeout=0.5)
        assert not done, "gave the partition up while its plan was being stored"
        held.release()
        await given
        async with connected(nats_url, "test") as nc:
            assert await snapshots_hold_what_they_claim(nc.jetstream()) == []
            at = await stream.kept(nc.jetstream())
            store = SnapshotStore(nc.jetstream())
            await store.open(create=False)
            snap = await store.load(partition("fn"), at.stream_id, at.last_seq)
        assert snap.seq == at.last_seq  # the plan's batch is the stream's last, and the snapshot holds it
        assert snap.states["fn"].instances["fn-1"].keep_until_ms > 0


async def test_a_release_answered_but_not_stored_is_stored_behind_its_answer(nats_url):
    """The append of the Idle's release fails once (the store away): its caller was answered already, so the node
    stores it all the same, and the instance is free again."""
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        held = Held(stack, Released, fail_once=True)
        held.release()
        assert (await stack.idle(first)).status == pb.Ok
        await eventually(lambda: stack.controller.states["fn"].instances["fn-1"].phase is Phase.IDLE)
        stored = await causes(nats_url)
        assert [events for cause, events in stored if cause == "idle:r1"] == [["Released"]]
        second = await stack.assign("r2")
        assert second.assigment.instance_id == "fn-1"


async def test_a_release_answered_through_an_outage_is_stored_first_once_its_partition_is_served_again(
    tmp_path, monkeypatch
):
    """NATS stopped right after the Idle's release was decided: its caller is answered, the append fails, the
    leases lapse and the partition is given up. The node stores the release all the same, as soon as it serves the
    partition again: before the next Assign, which reuses the instance. Not at the next try that the wait between
    tries (an hour here), or a send to the partition's owner, would bring: meanwhile the instance was held for a
    caller long gone, and a node stopped then lost the release."""
    monkeypatch.setattr(door, "RETRY_FIRST_S", 3600.0)
    nats = NatsServer(tmp_path / "nats")
    await nats.start()
    try:
        async with Stack(nats.url) as stack:
            first = await stack.assign("r1")
            await stack.settled()
            await nats.stop()
            assert (await stack.idle(first)).status == pb.Ok  # answered once decided, before it can be stored
            await eventually(lambda: not stack.controller.serving, seconds=30)  # the leases lapsed: given up
            await nats.start()
            await eventually(lambda: stack.controller.serves("fn"), seconds=30)
            second = await stack.assign("r2")
            stored = [(cause, events) for cause, events in await causes(nats.url) if cause in ("idle:r1", "assign:r2")]
            assert second.assigment.instance_id == "fn-1", f"r1's release not stored before r2 was decided: {stored}"
            assert [events for cause, events in stored if cause == "idle:r1"] == [["Released"]]
    finally:
        await nats.stop()


async def test_an_idle_is_answered_at_once_not_behind_its_functions_append_in_flight(tmp_path):
    """NATS stands still (SIGSTOP, shorter than the leases) while an Assign of the function is on its way to the
    store: the Idle of another of its requests, whose request holds its instance, is answered at once rather than
    once that append is answered (before, it waited in the lane behind it: about a synced append an Idle on a busy
    function, the Idle seconds of bench/live.py). Its release is stored behind the append once NATS moves again,
    and the Assign gets the instance it frees or another; replay equals the state."""
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url, lease_ttl_s=30.0) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        os.kill(nats.proc.pid, signal.SIGSTOP)
        try:
            second = asyncio.create_task(stack.assign("r2"))  # decided (a cold start), its append stuck
            await eventually(lambda: stack.controller.lanes.busy)
            async with asyncio.timeout(10):  # NATS still stopped: only an Idle answered without it returns
                assert (await stack.idle(first)).status == pb.Ok
            assert not second.done()
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        assert (await second).status == pb.Ok
        await stack.settled()
        stored = [cause for cause, _ in await causes(nats.url)]
        assert "idle:r1" in stored and stored.index("idle:r1") > stored.index("assign:r2"), stored
        async with connected(nats.url, "test") as nc:
            assert (await replay.replay(nc)).ledger.states["fn"] == stack.controller.states["fn"]


async def test_a_sure_release_is_answered_before_its_lane_has_it_and_stored_right_behind(nats_url):
    """An Idle whose request holds its instance is answered with nothing of the node's own work ahead of its
    answer: the door returns before the Idle is in its function's lane (no queue, no runner, no decision yet), and
    the Idle is queued on the loop's next turn, then decided and stored as any; replay equals the state. An Idle
    whose release is not sure (its instance is not the one its request holds) still waits for its decision."""
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        instance = first.assigment.instance_id
        idle = Idle(key="fn", request_id="r1", instance_id=instance, status_code=200, duration_ms=10)
        reply = await stack.controller.call(idle, 30)
        assert reply.code is Code.OK
        assert not stack.controller.lanes.busy, "the Idle was in its lane before its caller had the answer"
        await asyncio.sleep(0)
        assert stack.controller.lanes.busy, "the answered Idle was not handed to its lane right behind its answer"
        await stack.settled()
        assert stack.controller.states["fn"].instances[instance].phase is Phase.IDLE
        stored = [(cause, events) for cause, events in await causes(nats_url) if cause == "idle:r1"]
        assert [events for _, events in stored] == [["Released"]], stored
        wrong = Idle(key="fn", request_id="r1", instance_id="fn-9", status_code=200, duration_ms=10)
        refused = await stack.controller.call(wrong, 30)  # decided in its lane before it is answered
        assert refused.code is Code.NOT_FOUND, refused
        async with connected(nats_url, "test") as nc:
            assert (await replay.replay(nc)).ledger.states["fn"] == stack.controller.states["fn"]


async def test_a_caller_that_leaves_while_its_warm_assign_is_being_stored_leaves_no_instance_held(nats_url):
    """The caller hangs up while its warm Assign's batch is held at the store: the batch is stored all the same once
    the store moves, and the Cancel the door stores for the caller frees the instance it took. It is handed out
    again; each request is assigned once, the one that left before the Cancel; replay equals the state."""
    async with Stack(nats_url) as stack:
        await stack.idle(await stack.assign("warm"))
        await stack.settled()
        gave_up = []
        give_up = stack.controller.door.give_up
        stack.controller.door.give_up = lambda cmd, why: (gave_up.append(cmd.request_id), give_up(cmd, why))
        held = Held(stack, Assigned)
        leaving = asyncio.create_task(stack.assign("r1"))
        await held.reached.wait()
        leaving.cancel()  # the client cancels the call: gRPC cancels its handler, the door gives the Assign up
        await eventually(lambda: gave_up == ["r1"])
        held.release()
        await eventually(lambda: stack.controller.states["fn"].instances["fn-1"].phase is Phase.IDLE)
        await stack.settled()
        assert (await stack.assign("r2")).assigment.instance_id == "fn-1"
        stored = [cause for cause, _ in await causes(nats_url)]
        assert stored.count("assign:r1") == 1, stored
        cancel = next(i for i, cause in enumerate(stored) if cause.startswith("cancel:r1"))
        assert stored.index("assign:r1") < cancel < stored.index("assign:r2"), stored
        async with connected(nats_url, "test") as nc:
            assert (await replay.replay(nc)).ledger.states["fn"] == stack.controller.states["fn"]


async def queued_behind_an_append(stack: Stack) -> list[str]:
    """a0's append held while a1-a4 queue behind it, then let go: the request each answer went to, in order."""
    await stack.idle(await stack.assign("warm"))
    await stack.settled()
    held = Held(stack, Assigned)
    first = asyncio.create_task(stack.assign("a0"))
    await held.reached.wait()
    rest = [asyncio.create_task(stack.assign(f"a{n}")) for n in range(1, 5)]
    await asyncio.sleep(0.3)  # they queue behind the held append
    held.release()
    return [r.assigment.request_id for r in await asyncio.gather(first, *rest)]


async def stored_together(nats_url: str) -> list[list[str]]:
    """The causes of the a-requests' Assigns in each of the function's messages that holds any, in order."""
    grouped: list[list[str]] = []

    def each(seq: int, b) -> None:
        if causes := [d.cause for d in b.decisions() if d.cause.startswith("assign:a")]:
            grouped.append(causes)

    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), each, function_events("fn"))
    return grouped


async def test_commands_that_queue_behind_an_append_are_decided_in_order_and_stored_together(nats_url):
    async with Stack(nats_url) as stack:
        assert await queued_behind_an_append(stack) == [f"a{n}" for n in range(5)]
        grouped = await stored_together(nats_url)
    assert grouped == [["assign:a0"], [f"assign:a{n}" for n in range(1, 5)]], grouped


async def test_a_group_past_its_deciding_budget_leaves_the_rest_to_the_next_group_in_order(nats_url, monkeypatch):
    """Deciding holds the event loop, so a group takes no more commands once it has decided for DECIDE_BUDGET_S (a
    burst on a busy machine held the loop for half a second, and gRPC's reads and the leases' renewals with it):
    the next group decides the rest, in order, and each is answered. Here no time at all: a command a group."""
    monkeypatch.setattr(lane, "DECIDE_BUDGET_S", 0.0)
    async with Stack(nats_url) as stack:
        assert await queued_behind_an_append(stack) == [f"a{n}" for n in range(5)]
        grouped = await stored_together(nats_url)
    assert grouped == [[f"assign:a{n}"] for n in range(5)], grouped


async def test_a_call_the_node_cannot_store_is_refused_unavailable_and_nothing_is_answered_ok(nats_url):
    async with Stack(nats_url) as stack:
        stack.controller.writer.patience_s = 0.0  # no retry through the outage

        async def refuse(a):
            raise Unavailable("event store unavailable: held by the test")

        stack.controller.writer.store.append = refuse
        try:
            await stack.assign("r1")
        except grpc.aio.AioRpcError as e:
            assert e.code() is grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError("an Assign was answered although nothing could be stored")


class Unstorable:
    """A lane that answers its group's Idles at once, then can store nothing: the store away."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.clock = Clock()

    async def commit(self, key, cmds, told):
        told.update(c.reply_to for c in cmds if isinstance(c, Idle))
        raise Unavailable("event store unavailable: held by the test")

    async def plan(self, key):
        pass


class Everything:
    """Partitions that serve every function, always."""

    def check(self, p):
        pass

    def serves(self, key):
        return True

    def entered(self, p):
        pass

    def left(self, p):
        pass


async def test_in_a_group_nothing_of_which_was_stored_an_idle_already_answered_is_told_so():
    """The Idle's caller was answered: its outcome says so (Told: stored behind it by the door), whatever else is in
    its group (the node's own Tick, a worker's report: commands with no caller to tell)."""
    lane = Unstorable()
    lanes = Lanes(lane, Replies(), Timers(lane.clock, lambda key, due: None), Admission(), Everything(), None, None)
    idle = lanes.submit(Idle(key="fn", request_id="r1", instance_id="fn-1", reply_to="caller"))
    tick = lanes.submit(Tick(key="fn", due_ms=0))
    report = lanes.submit(SlotDestroyed(key="fn", instance_id="fn-2", slot_id="s-2"))
    await asyncio.wait({idle, tick, report})
    assert isinstance(idle.exception(), Told)
    assert type(tick.exception()) is Unavailable and type(report.exception()) is Unavailable


async def test_a_plan_owed_when_the_node_stopped_is_made_by_the_next_one(nats_url, monkeypatch):
    """The node stops right after an Idle whose plan it could not store (the store away a moment): the instance is
    idle with no keep-alive, and nothing would wake the function before its next call, nor reconcile it on a
    platform that lists nothing. The node that loads it plans it at once."""
    async with Stack(nats_url) as stack:
        first = await stack.assign("r1")
        await stack.settled()
        stack.controller.writer.patience_s = 0.0  # the append not tried again through the outage...
        monkeypatch.setattr(lanes, "RETRY_PLAN_MS", 600_000)  # ...nor the plan before the node stops
        monkeypatch.setattr(Lane, "_plan_along", lambda *_: None)  # the plan its own batch, as an Assign's is
        held = Held(stack, KeptAlive, fail_once=True)
        held.release()
        await stack.idle(first)
        await held.reached.wait()
        assert stack.controller.states["fn"].instances["fn-1"].keep_until_ms == 0
    assert (PLAN, ["KeptAlive"]) not in await causes(nats_url)
    async with Stack(nats_url, like_challenge=True) as stack:
        await eventually(lambda: stack.controller.states["fn"].instances["fn-1"].keep_until_ms > 0)
    assert (PLAN, ["KeptAlive"]) in await causes(nats_url)
