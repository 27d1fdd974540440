"""The write path on a real nats-server, with batches made by hand: no decision, no policy, no node."""

import asyncio
import contextlib
import functools

import pytest

from controller.ledger import Ledger
from controller.writer import Conflict, TooBig, Writer
from proto.events import Batch, RequestArrived
from proto.subjects import function_events
from runtime import stream
from runtime.bus import Unavailable, connected, ensure_stream


def batch(key: str, n: int, size: int = 0) -> Batch:
    event = RequestArrived(at_ms=n, request_id=f"r{n}" + "x" * size)
    return Batch(key=key, at_ms=n, cause=f"assign:{key}:r{n}", events=[event])


@pytest.fixture
async def js(nats_url):
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        yield nc, js


def writer(nc, js, ledger: Ledger | None = None, owns=lambda key: True, **kw) -> Writer:
    return Writer(nc, js, ledger or Ledger(), owns, **kw)


@contextlib.contextmanager
def appending(how):
    """stream.append replaced by `how` (given the real one) for the block."""
    real = stream.append
    stream.append = functools.partial(how, real)
    try:
        yield
    finally:
        stream.append = real


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
    assert w.doubtful == {"fn": lost_ack} and "fn" not in w.ledger.last_seq
    assert await w.settle("fn") is True
    assert w.doubtful == {} and await w.settle("fn") is False
    assert await stored(js, "fn") == ["assign:fn:r1"]
    assert len(w.ledger.state("fn").queue) == 1

    with appending(no_answer), pytest.raises(Unavailable):
        await w.append(batch("gn", 1))
    assert await w.settle("gn") is True
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


async def test_a_function_no_longer_ours_is_not_retried_and_forgetting_drops_its_doubt(js):
    nc, js = js
    w = writer(nc, js, owns=lambda key: False)
    attempts = []

    async def counted(real, *args, **kw):
        attempts.append(1)
        await no_answer(real)

    with appending(counted), pytest.raises(Unavailable):
        await w.append(batch("fn", 1))
    assert len(attempts) == 1 and "fn" in w.doubtful
    w.forget(lambda key: key == "fn")
    assert w.doubtful == {}
