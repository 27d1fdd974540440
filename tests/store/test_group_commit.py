"""Group commit on a real nats-server: the commands of one function that arrive while its append is in flight
are decided in arrival order and stored as one message, one ack answering them all; nobody is answered
before the message holding their decision is stored; replay explains each decision on its own."""

import asyncio
import os
import signal

from scaler import replay
from scaler.proto.events import Batch, RequestArrived, decode_batch, encode_batch, join
from scaler.proto.subjects import function_events
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.store import stream
from scaler.store.commits import SHARE_FROM_LONE
from tests.replay.test_replay import scaler_replay
from tests.stack import Stack, eventually


async def stored(url: str, key: str) -> list[tuple[int, Batch]]:
    found: list[tuple[int, Batch]] = []
    async with connected(url, "test") as nc:
        await stream.read(nc.jetstream(), lambda seq, b: found.append((seq, b)), function_events(key))
    return found


async def test_a_stalled_nats_holds_every_reply_of_a_batch_until_it_is_stored(tmp_path):
    """nats-server stopped (SIGSTOP) while an append is in flight: the calls arriving meanwhile wait, none is
    answered before NATS runs again and stores them, and then they are stored as one message and all served."""
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url) as stack:
        first = await stack.assign("warm")  # the function exists and has an idle instance
        await stack.idle(first)
        await stack.settled()  # its release and plan stored
        before = len(await stored(nats.url, "fn"))
        os.kill(nats.proc.pid, signal.SIGSTOP)
        try:
            calls = [asyncio.create_task(stack.assign("r0"))]
            none = 1 << 62  # the writer's floor when no append is under way
            await eventually(lambda: stack.controller.writer.floor(none) != none)  # r0's append is in flight
            calls += [asyncio.create_task(stack.assign(f"r{n}")) for n in range(1, 8)]
            done, _ = await asyncio.wait(calls, timeout=2.0)
            assert not done, "a reply went out while NATS stood still: before its decision was stored"
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        replies = await asyncio.gather(*calls)
        assert sorted(r.assigment.request_id for r in replies) == [f"r{n}" for n in range(8)]
        batches = [b for _, b in (await stored(nats.url, "fn"))[before:]]
        assigns = [[d.cause for d in b.decisions() if d.cause.startswith("assign:")] for b in batches]
        assert sorted(c for group in assigns for c in group) == [f"assign:r{n}" for n in range(8)], assigns
        # The first call's append was in flight when NATS stopped; the seven arriving meanwhile, stored as one.
        assert max(len(group) for group in assigns) == 7, f"not stored together: {assigns}"


async def test_functions_stored_while_nats_stood_still_share_one_atomic_batch_and_none_is_answered_before(tmp_path):
    """nats-server stopped (SIGSTOP) while one function's append is in flight: the calls of other functions arriving
    meanwhile are not answered before NATS runs again. On a lone server the first SHARE_FROM_LONE appends go alone
    (an atomic batch is staged on disk there, slower than a few appends at once); those that find that many on their
    way are stored as one atomic batch (one commit, one ack), each function's on its own subject with its own order
    check; replay equals the state."""
    keys = [f"fn{n}" for n in range(SHARE_FROM_LONE + 4)]
    async with NatsServer(tmp_path / "nats") as nats, Stack(nats.url) as stack:
        for key in keys:  # each function exists and has an idle instance
            await stack.idle(await stack.assign(f"warm-{key}", key))
        await stack.settled()  # every release and plan stored
        await stack.controller.partitions.leases.round()  # renewed just now: NATS stands still within the leases
        os.kill(nats.proc.pid, signal.SIGSTOP)
        try:
            first = asyncio.create_task(stack.assign("r-fn0", "fn0"))  # its append is on its way
            await asyncio.sleep(0.3)
            calls = [asyncio.create_task(stack.assign(f"r-{key}", key)) for key in keys[1:]]
            done, _ = await asyncio.wait([first, *calls], timeout=1.2)
            assert not done, "a reply went out while NATS stood still: before its decision was stored"
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        replies = await asyncio.gather(first, *calls)
        assert [r.assigment.request_id for r in replies] == [f"r-{key}" for key in keys]
        # Their partitions served again, if NATS stood still past their leases: a reload stores what it moves
        # (a ClockRebased when the stalled batches look written on a clock behind) before it serves.
        await eventually(lambda: all(stack.controller.serves(k) for k in keys))
        async with connected(nats.url, "test") as nc:
            js = nc.jetstream()
            batch_ids = []
            for key in keys:
                # the assignment's batch: a reload's ClockRebased may follow it
                seq = next(seq for seq, b in await stored(nats.url, key) if b.cause == f"assign:r-{key}")
                batch_ids.append(((await js.get_msg("EVENTS", seq)).headers or {}).get("Nats-Batch-Id"))
            alone, shared = batch_ids.count(None), {b for b in batch_ids if b is not None}
            assert alone == SHARE_FROM_LONE and len(shared) == 1, f"not {alone} alone, then one batch: {batch_ids}"
            replayed = await replay.replay(nc)
        assert {k: replayed.ledger.states[k] for k in keys} == {k: stack.controller.states[k] for k in keys}


async def test_a_group_stays_under_the_payload_limit_and_replay_explains_each_decision(tmp_path):
    async with NatsServer(tmp_path / "nats", max_payload=16384) as nats, Stack(nats.url) as stack:
        await stack.idle(await stack.assign("warm"))
        os.kill(nats.proc.pid, signal.SIGSTOP)
        try:
            ids = [f"{n:03d}-" + "x" * 200 for n in range(80)]  # each decision's batch holds its id 2-3 times
            calls = [asyncio.create_task(stack.assign(i)) for i in ids]
            await asyncio.sleep(0.5)
        finally:
            os.kill(nats.proc.pid, signal.SIGCONT)
        await asyncio.gather(*calls)
        found = await stored(nats.url, "fn")
        several = [b for _, b in found if len(b.decisions()) > 1]
        assert len(several) >= 2, "the 80 decisions needed several messages of several decisions each"
        async with connected(nats.url, "test") as nc:
            for seq, _ in found:
                assert len((await nc.jetstream().get_msg("EVENTS", seq)).data) <= 16384 - stream.HEADERS_ROOM
            replayed = await replay.replay(nc, key="fn")
        assert replayed.ledger.states["fn"] == stack.controller.states["fn"]
        code, out, err = await scaler_replay("--nats", nats.url, "--key", "fn")
        assert code == 0, err
        for i in ids:
            assert sum(f"assign:{i} →" in line for line in out.splitlines()) == 1, i


def test_a_joined_batch_gives_back_each_decision_and_a_lone_one_is_itself():
    def one(n: int, events: int, wake: int | None) -> Batch:
        arrived = [RequestArrived(at_ms=n, request_id=f"r{n}-{k}") for k in range(events)]
        return Batch(key="fn", at_ms=n, cause=f"assign:r{n}", events=arrived, wake_ms=wake)

    decisions = [one(1, 2, 10), one(2, 1, None), one(3, 3, 30)]
    joined = decode_batch(encode_batch(join(decisions)))
    assert joined.decisions() == decisions
    assert (joined.cause, joined.at_ms, joined.wake_ms, len(joined.events)) == ("assign:r1", 1, 30, 6)
    assert join(decisions[:1]) is decisions[0] and decisions[0].decisions() == [decisions[0]]
