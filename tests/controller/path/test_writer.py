"""The write path on a real nats-server, with batches made by hand: no decision, no policy, no node."""

import asyncio
import contextlib
import functools

import pytest

from scaler.controller.ledger import Ledger
from scaler.controller.path.writer import FENCE, Conflict, TooBig, Writer
from scaler.proto.events import Batch, RequestArrived
from scaler.proto.subjects import function_events, partition
from scaler.runtime.bus import Unavailable, connected
from scaler.store import EventStore, NotSent, stream
from scaler.store.config import ensure_stream


def batch(key: str, n: int, size: int = 0) -> Batch:
    event = RequestArrived(at_ms=n, request_id=f"r{n}" + "x" * size)
    return Batch(key=key, at_ms=n, cause=f"assign:{key}:r{n}", events=[event])


@pytest.fixture
async def js(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        yield nc, js


def writer(nc, js, ledger: Ledger | None = None, owns=lambda key: True, atomic: bool = False, **kw) -> Writer:
    store = EventStore(nc)
    store.commits.atomic = atomic  # as `EventStore.ensure` sets it on a stream that takes them; shared as on a cluster
    return Writer(store, ledger or Ledger(), owns, **kw)


@contextlib.contextmanager
def appending(how, name: str = "append"):
    """stream.append (or `name`, say append_all) replaced by `how` (given the real one) for the block."""
    real = getattr(stream, name)
    setattr(stream, name, functools.partial(how, real))
    try:
        yield
    finally:
        setattr(stream, name, real)


async def no_answer(real, *args, **kw):
    raise Unavailable("event store unavailable: TimeoutError")


async def stored(js, key: str) -> list[str]:
    causes: list[str] = []
    await stream.read(js, lambda seq, b: causes.append(b.cause), function_events(key))
    return causes


async def test_appends_follow_the_ledger_and_a_stale_writer_conflicts(js):
    nc, js = js
    mine, theirs = writer(nc, js), writer(nc, js)
    seq = await mine.append(batch("fn", 1))
    mine.ledger.fold(seq, batch("fn", 1))
    mine.ledger.fold(await mine.append(batch("fn", 2)), batch("fn", 2))
    with pytest.raises(Conflict):  # its ledger has not seen fn's batches
        await theirs.append(batch("fn", 3))
    await theirs.append(batch("other", 1))  # another function: no conflict
    assert await stored(js, "fn") == ["assign:fn:r1", "assign:fn:r2"]


async def test_catch_up_folds_another_writers_batches_then_appends_after_them(js):
    nc, js = js
    mine, theirs = writer(nc, js), writer(nc, js)
    for n in (1, 2):
        theirs.ledger.fold(await theirs.append(batch("fn", n)), batch("fn", n))
    await mine.catch_up("fn")
    assert mine.ledger.last_seq["fn"] == theirs.ledger.last_seq["fn"]
    assert len(mine.ledger.state("fn").queue) == 2
    await mine.append(batch("fn", 3))
    assert await stored(js, "fn") == ["assign:fn:r1", "assign:fn:r2", "assign:fn:r3"]


async def test_a_batch_no_message_can_hold_is_refused_before_it_is_sent(js):
    nc, js = js
    with pytest.raises(TooBig):
        await writer(nc, js).append(batch("fn", 1, size=nc.max_payload))
    assert await stored(js, "fn") == []


async def test_an_unanswered_append_is_doubtful_and_settles_once_whether_it_was_stored_or_not(js):
    """Stored without an answer (its ack lost): settling folds it, never appending it twice. Not stored: settling
    stores it. Either way the batch is in the stream once and the ledger holds it."""
    nc, js = js
    w = writer(nc, js, patience_s=0.0)
    lost_ack = batch("fn", 1)

    async def ack_lost(real, *args, **kw):
        await real(*args, **kw)
        raise Unavailable("event store unavailable: TimeoutError")

    with appending(ack_lost), pytest.raises(Unavailable):
        await w.append(lost_ack)
    assert w.doubtful["fn"].batch == lost_ack and "fn" not in w.ledger.last_seq
    assert await w.settle("fn", now=0) is True
    assert w.doubtful == {} and await w.settle("fn", now=0) is False
    assert await stored(js, "fn") == ["assign:fn:r1"]
    assert len(w.ledger.state("fn").queue) == 1

    with appending(no_answer), pytest.raises(Unavailable):
        await w.append(batch("gn", 1))
    assert await w.settle("gn", now=0) is True
    assert await stored(js, "gn") == ["assign:gn:r1"]
    assert w.ledger.last_seq["gn"] == await stream.last_seq(js, function_events("gn"))


async def test_the_floor_holds_below_an_append_under_way(js):
    """A snapshot's watermark must not claim a batch stored and not yet applied."""
    nc, js = js
    w = writer(nc, js)
    w.ledger.fold(await w.append(batch("a", 1)), batch("a", 1))
    gate = asyncio.Event()

    async def held(real, *args, **kw):
        seq = await real(*args, **kw)
        await gate.wait()
        return seq

    with appending(held):
        under_way = asyncio.create_task(w.append(batch("b", 1)))
        await asyncio.sleep(0.2)
        assert w.floor(otherwise=10**9) == w.ledger.seq  # the sequence when that append began
        gate.set()
        await under_way
    assert w.floor(otherwise=10**9) == 10**9


async def test_a_function_no_longer_ours_is_not_retried_and_its_doubt_is_settled_by_a_fence_not_sent_again(js):
    """Given up while its append had no answer, a batch is never sent again, however its function's partition comes
    back: a fence after the stream's last batch of the function settles it (stored only if the batch was not, and
    then the batch never can be); its partition's snapshots claim nothing past it meanwhile."""
    nc, js = js
    ours = {"fn": True}
    w = writer(nc, js, owns=lambda key: ours[key])
    attempts = []

    async def counted(real, *args, **kw):
        attempts.append(1)
        ours["fn"] = False  # its lease lapses while the store does not answer
        await no_answer(real)

    w.ledger.seq = 7
    with appending(counted), pytest.raises(Unavailable):
        await w.append(batch("fn", 1))
    assert len(attempts) == 1 and "fn" in w.doubtful
    assert w.floor(otherwise=10**9, partitions={partition("fn")}) == 7
    assert w.floor(otherwise=10**9, partitions={partition("fn") + 1}) == 10**9  # another partition's claims: free
    w.forget({partition("fn")})
    assert w.in_doubt({partition("fn")}) == ["fn"]  # kept: the batch may still land, so the floor holds
    ours["fn"] = True  # the partition is this node's again
    assert await w.settle("fn", now=5) is True and w.doubtful == {}
    assert await stored(js, "fn") == [FENCE]  # the fence, not the batch decided under the lease given up
    assert w.ledger.last_seq["fn"] == await stream.last_seq(js, function_events("fn"))


async def test_a_retried_or_settled_append_keeps_the_order_check_it_was_decided_under(js):
    """A batch decided on the function's state at seq S is stored right after S or not at all: its doubt, settled
    after the ledger has moved on (another batch folded meanwhile), conflicts instead of being stored after it."""
    nc, js = js
    w, other = writer(nc, js, patience_s=0.0), writer(nc, js)
    decided_on = batch("fn", 1)

    async def ack_lost(real, *args, **kw):
        raise Unavailable("event store unavailable: TimeoutError")

    with appending(ack_lost), pytest.raises(Unavailable):
        await w.append(decided_on)  # decided on an empty function: expects nothing before it
    assert w.doubtful["fn"].after == 0
    other.ledger.fold(await other.append(batch("fn", 2)), batch("fn", 2))  # e.g. the owner after a hand-over
    await w.catch_up("fn")  # this node learns of it
    assert await w.settle("fn", now=0) is True
    assert await stored(js, "fn") == ["assign:fn:r2"]  # the doubtful batch was not stored after it


async def test_an_append_is_not_sent_once_its_writer_may_no_longer_write(js):
    """Past its partition's lease (or given up), a batch still waiting to be sent is not sent: NotSent, and no doubt,
    as nothing of it went out."""
    nc, js = js
    w = writer(nc, js, owns=lambda key: False)
    with pytest.raises(NotSent):
        await w.append(batch("fn", 1))
    assert w.doubtful == {} and await stored(js, "fn") == []


@pytest.fixture
async def atomic_js(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js, atomic=True)
        yield nc, js


async def test_appends_of_several_functions_arriving_together_are_one_atomic_batch(atomic_js):
    nc, js = atomic_js
    w = writer(nc, js, atomic=True)
    keys = [f"fn{n}" for n in range(10)]
    seqs = await asyncio.gather(*(w.append(batch(k, 1)) for k in keys))
    assert sorted(seqs) == list(range(1, 11))
    batch_ids = set()
    for seq in seqs[1:]:  # the first went alone, at once; those arriving meanwhile together
        msg = await js.get_msg("EVENTS", seq)
        batch_ids.add((msg.headers or {}).get("Nats-Batch-Id"))
    assert len(batch_ids) == 1 and None not in batch_ids, batch_ids


async def test_appends_share_a_commit_only_once_as_many_as_the_stream_says_are_on_their_way(atomic_js):
    """On a lone server an atomic batch is slower than a few appends sent at once (bench/sync.py): appends go alone
    until `share_from` are on their way; those that come after wait, and share the next commit."""
    nc, js = atomic_js
    w = writer(nc, js, atomic=True)
    w.store.commits.share_from = 3
    keys = [f"fn{n}" for n in range(8)]
    seqs = await asyncio.gather(*(w.append(batch(k, 1)) for k in keys))
    batch_ids = [((await js.get_msg("EVENTS", seq)).headers or {}).get("Nats-Batch-Id") for seq in seqs]
    assert batch_ids[:3] == [None] * 3, batch_ids  # alone, at once
    assert None not in batch_ids[3:] and len(set(batch_ids[3:])) == 1, batch_ids  # the five after them: one batch
    for k in keys:
        assert await stored(js, k) == [f"assign:{k}:r1"]


async def test_one_stale_function_in_a_shared_commit_gets_the_conflict_and_the_others_are_stored(atomic_js):
    """JetStream refuses the whole atomic batch without saying whose order check failed: each append is then sent
    alone, so the other functions' decisions are stored and only the stale one hears Conflict."""
    nc, js = atomic_js
    w, stale = writer(nc, js, atomic=True), writer(nc, js, atomic=True)
    await stale.append(batch("fn3", 0))  # fn3's last batch is one `w`'s ledger does not know
    refused = []

    async def watched(real, *args, **kw):
        try:
            return await real(*args, **kw)
        except Conflict:
            refused.append(len(args[1]))
            raise

    keys = [f"fn{n}" for n in range(6)]
    with appending(watched, "append_all"):
        outcomes = await asyncio.gather(*(w.append(batch(k, 1)) for k in keys), return_exceptions=True)
    assert refused == [5], refused  # the five arriving while fn0's append was on its way: one batch, refused
    assert [type(o) for o in outcomes].count(Conflict) == 1 and isinstance(outcomes[3], Conflict)
    for k in keys:
        assert await stored(js, k) == (["assign:fn3:r0"] if k == "fn3" else [f"assign:{k}:r1"])


async def test_an_append_whose_caller_left_is_stored_and_the_functions_next_one_conflicts(atomic_js):
    """JetStream checks every message of an atomic batch against the stream before the batch, so two appends of
    one function expecting the same last batch would both be stored. The append of a caller who stopped waiting
    (a timeout) is stored all the same; the function's next append expects the same last batch and must conflict
    (caught up, decided again), never be stored beside it."""
    nc, js = atomic_js
    w = writer(nc, js, atomic=True)
    gate = asyncio.Event()

    async def held(real, *args, **kw):  # the first append stays on its way until the gate opens
        if args[3] == function_events("other"):
            await gate.wait()
        return await real(*args, **kw)

    with appending(held):
        on_its_way = asyncio.create_task(w.append(batch("other", 1)))
        await asyncio.sleep(0.05)
        left = asyncio.create_task(w.append(batch("fn", 1)))
        await asyncio.sleep(0.05)
        left.cancel()  # its caller timed out: the append waits on all the same
        await asyncio.sleep(0)
        assert w.doubtful["fn"].batch == batch("fn", 1)  # it may be stored: settled before the function's next group
        nxt = asyncio.create_task(w.append(batch("fn", 2)))  # e.g. the Cancel of that timed-out Assign
        await asyncio.sleep(0.05)
        gate.set()
        await on_its_way
        with pytest.raises(Conflict):
            await nxt
    assert await stored(js, "fn") == ["assign:fn:r1"]
    assert await w.settle("fn", now=0) is True and w.doubtful == {}  # it was stored: folded, not appended again
    assert await stored(js, "fn") == ["assign:fn:r1"] and len(w.ledger.state("fn").queue) == 1
