"""`scaler replay`: the state rebuilt from the stream, readable, and equal to the running controller's."""

import asyncio
import io
import re
import signal
import sqlite3
import sys

import msgspec
import pytest
from msgspec.structs import replace

from scaler import replay
from scaler.controller import state_service
from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState, Phase
from scaler.controller.leases import LEASES, bucket
from scaler.controller.snapshots import Snapshot
from scaler.proto.events import Batch, RequestWaiting, encode_batch
from scaler.proto.subjects import event_subject, partition
from scaler.replay import explain
from scaler.runtime.bus import Unavailable, connected
from scaler.runtime.natsd import NatsServer
from scaler.runtime.ports import free_port
from scaler.store import stream
from scaler.store.config import ensure_stream
from tests.cli.test_up import assign_and_idle, start_up, stop
from tests.stack import Stack


async def scaler_replay(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scaler",
        "replay",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def traffic(stack: Stack) -> None:
    first = await stack.assign("r1")
    await stack.idle(first)
    await stack.settled()  # its release stored, and the plan after it: a keep-alive
    second = await stack.assign("r2")  # reuses fn-1
    third = await stack.assign("r3")  # cold-starts fn-2
    await stack.idle(third, need_destroy=True)
    await stack.settled()
    assert second.assigment.instance_id == "fn-1"


async def test_replay_prints_the_state_and_a_readable_timeline(nats_url):
    async with Stack(nats_url) as stack:
        await traffic(stack)
        code, out, err = await scaler_replay("--nats", nats_url, "--key", "fn")
    assert code == 0, err
    timeline, _, summary = out.partition("\n\n")
    assert "seq 1 assign:r1 → function seen: 256 MB python, timeout 60s; request r1 queued; start fn-1 for r1 (" in (
        timeline
    )
    assert "ready:fn-1 → fn-1 ready on slot-" in timeline and "r1 → fn-1" in timeline
    assert "idle:r1 → r1 done with fn-1 (status 200, ran 10 ms)" in timeline
    assert "fn-2 retired (need_destroy)" in timeline and "destroyed:fn-2 → fn-2 gone with slot-" in timeline
    assert "next deadline" in timeline
    assert "arrivals 3, cold starts 2" in summary
    assert re.search(r"fn-1 +busy +slot-\S+, held by r2", summary)
    assert "fn-2" not in summary


async def test_replay_up_to_a_sequence_or_a_time(nats_url):
    async with Stack(nats_url) as stack:
        await traffic(stack)
        async with connected(nats_url, "test") as nc:
            early = await replay.replay(nc, until_seq=1)
            assert early.batches == 1 and early.states["fn"].in_phase(Phase.CREATING)
            whole = await replay.replay(nc)
            assert whole.states == stack.controller.states
            first_at = early.ledger.features_of("fn").last_arrival_ms
            by_time = await replay.replay(nc, until_ms=first_at)
            assert by_time.states == early.states
    assert replay.parse_time("2023-01-01T00:00:00") == 1_672_531_200_000 == replay.parse_time("1672531200000")
    assert replay.parse_time("2023-01-01T01:00:00+01:00") == 1_672_531_200_000


async def test_verify_finds_the_running_state_equal_and_then_a_difference(nats_url):
    async with Stack(nats_url) as stack:
        await traffic(stack)
        async with connected(nats_url, "test") as nc:
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 0
            assert "verified: 1 function equal" in out.getvalue()
            # Corrupt the running state behind the log's back: verify must say where.
            s = stack.controller.states["fn"]
            inst = s.instances["fn-1"]
            stack.controller.states["fn"] = replace(s, instances={"fn-1": replace(inst, phase=Phase.IDLE)})
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 1
            assert "MISMATCH fn:\n  instances.fn-1.phase: replayed 'busy', controller 'idle'" in out.getvalue()
            # The features are kept beside the state, and compared too.
            stack.controller.states["fn"] = s
            learned = stack.controller.ledger.features["fn"]
            stack.controller.ledger.features["fn"] = replace(learned, arrivals=learned.arrivals + 5)
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 1
            said = out.getvalue()
            assert f"features.arrivals: replayed {learned.arrivals}, controller {learned.arrivals + 5}" in said, said
        code, out, _ = await scaler_replay("--nats", nats_url, "--verify")
        assert code == 1 and "MISMATCH fn" in out


async def test_verify_while_the_controller_keeps_appending(nats_url):
    async with Stack(nats_url) as stack:
        load = asyncio.gather(*(stack.assign(f"r{n}", key=f"fn{n % 5}") for n in range(60)))
        async with connected(nats_url, "test") as nc:
            for _ in range(5):
                assert await replay.verify(nc, None, io.StringIO()) == 0
        await load


async def test_verify_waits_for_a_partition_held_and_not_yet_loaded_and_says_when_it_never_is(nats_url, monkeypatch):
    async with Stack(nats_url) as stack:
        await assign_and_idle_in(stack, "r1", "fn")
        p = partition("fn")
        async with connected(nats_url, "test") as nc:
            # Its lease held, its functions not served: a node that took the partition over and is loading it.
            stack.controller.serving.discard(p)
            monkeypatch.setattr(replay, "SERVE_S", 1.0)
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 1
            said = out.getvalue()
            assert f"not compared: partitions {p} are held by a node that does not serve them" in said, said
            assert "MISMATCH" not in said, "a partition not loaded is not a state that differs"
            # Loaded a moment after the verify began: it waits, then compares the partition's functions too.
            monkeypatch.setattr(replay, "SERVE_S", 30.0)
            asyncio.get_running_loop().call_later(1.0, stack.controller.serving.add, p)
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 0, out.getvalue()
            assert "verified: 1 function equal" in out.getvalue()


async def assign_and_idle_in(stack: Stack, request_id: str, key: str) -> None:
    reply = await stack.assign(request_id, key=key)
    await stack.idle(reply)


async def test_each_partitions_functions_come_from_its_holder_alone(nats_url):
    """Mid-hand-over the node giving a partition up may still answer for it: its copy is not the holder's."""
    first, second = "fn", next(f"fn{n}" for n in range(100) if partition(f"fn{n}") != partition("fn"))
    p, q = partition(first), partition(second)
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        leases = await bucket(js, LEASES, ttl_s=60, replicas=1)
        await leases.put(f"p{p}", b"a")
        await leases.put(f"p{q}", b"b")
        old, new = FnState(key=second, started=1), FnState(key=second, started=2)
        held_by = {"a": {first: FnState(key=first), second: old}, "b": {second: new}}
        serving = {"a": {p, q}, "b": set()}  # a still serves q, which b holds and loads

        def take(node: str):
            def snap(partitions: set[int]) -> Snapshot:
                states = {k: v for k, v in held_by[node].items() if partition(k) in partitions}
                return Snapshot(seq=5, stream="s", last_seq={}, states=states)

            return snap

        answering = [state_service.Serving(nc, n, take(n), serving[n]) for n in ("a", "b")]
        for node in answering:
            await node.start()
        try:
            running = await state_service.fetch(nc)
            assert running.unserved == [q] and set(running.states) == {first}, running
            asyncio.get_running_loop().call_later(0.5, serving["b"].add, q)
            running = await state_service.fetch(nc, serve_s=10)
            assert running.unserved == [] and running.states == {first: FnState(key=first), second: new}
        finally:
            for node in answering:
                await node.stop()


def test_a_large_state_travels_in_several_messages():
    snap = Snapshot(seq=7, stream="s", last_seq={f"k{n}": n for n in range(50)}, states={})
    learned = {k: FnStats(arrivals=n) for n, k in enumerate(snap.last_seq) if n % 2}  # some learned nothing yet
    with_states = replace(snap, states={k: state_service.FnState(key=k) for k in snap.last_seq}, features=learned)
    parts = state_service.chunks(with_states, max_bytes=1200)
    assert len(parts) > 1 and all(len(p) <= 1200 for p in parts)
    decoded = [msgspec.msgpack.decode(p, type=state_service.StateChunk) for p in parts]
    assert [c.more for c in decoded] == [True] * (len(parts) - 1) + [False]
    assert {k: v for c in decoded for k, v in c.states.items()} == with_states.states
    assert {k: v for c in decoded for k, v in c.features.items()} == learned
    assert {k: v for c in decoded for k, v in c.last_seq.items()} == snap.last_seq


async def test_replay_reads_the_store_a_stopped_scaler_up_left(tmp_path):
    proc, address, _ = await start_up("--data-dir", str(tmp_path))
    try:
        await assign_and_idle(address, "r1")
        code, _, err = await scaler_replay("--data-dir", str(tmp_path))
        assert code == 2 and "is in use by a running scaler: read it live (`scaler replay` without" in err
    finally:
        code, rest = await stop(proc)
    assert code == 0, rest
    code, out, err = await scaler_replay("--data-dir", str(tmp_path), "--key", "hello")
    assert code == 0, err
    assert "assign:r1 → function seen: 128 MB python" in out and re.search(r"hello-1 +idle", out)


async def test_replay_refuses_bad_input_clearly(tmp_path, nats_url):
    cases = [
        (["--data-dir", str(tmp_path / "nothing")], "no NATS store in"),
        (["--nats", nats_url], "no EVENTS stream at"),
        (["--nats", nats_url, "--until", "yesterday"], "neither epoch ms nor an ISO time"),
        (["--nats", "nats://127.0.0.1:1"], "cannot reach NATS at nats://127.0.0.1:1"),
        (["--data-dir", str(tmp_path), "--verify"], "use --nats, not --data-dir"),
    ]
    for args, message in cases:
        code, _, err = await scaler_replay(*args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
    async with Stack(nats_url):
        pass
    code, _, err = await scaler_replay("--nats", nats_url, "--verify")
    assert code == 2 and "no controller answered on scaler.controller.state" in err


def test_a_request_left_waiting_reads_as_words():
    why = "wait ~3 ms for a busy instance rather than a 500 ms start"
    waiting = RequestWaiting(at_ms=0, request_id="r1", expected_ms=1_672_531_200_123, why=why)
    assert explain.event(waiting) == f"r1 waits for a busy instance, served about 00:00:00.123 ({why})"


async def test_replay_reads_the_nats_the_node_it_is_given_says_it_uses():
    """Two `scaler up`s side by side: each replay reads the one whose gateway it names."""
    first, first_address, _ = await start_up()
    second, second_address, _ = await start_up()
    try:
        await assign_and_idle(first_address, "r1")
        code, out, err = await scaler_replay("--gateway", first_address, "--key", "hello")
        assert code == 0, err
        assert "assign:r1 → function seen: 128 MB python" in out
        assert re.search(r"\n1 function from \d+ batches, ", out), out  # not "1 functions"
        code, out, err = await scaler_replay("--gateway", second_address)
        assert code == 0, err
        assert "assign:r1" not in out and "0 functions" in out, out
    finally:
        for proc in (first, second):
            code, rest = await stop(proc)
            assert code == 0, rest
    nobody = f"127.0.0.1:{free_port()}"
    code, _, err = await scaler_replay("--gateway", nobody)
    assert code == 2 and err == (
        f"scaler replay: no scaler answers at {nobody} (waited 5s): pass --gateway HOST:PORT (the gRPC address"
        " `scaler up` said), or --nats URL\n"
    ), err


async def test_a_read_that_hears_nothing_more_gives_up_instead_of_waiting_forever(tmp_path, monkeypatch):
    """A consumer lost with its server delivers nothing more: the read says so (Unavailable), and its caller
    (a start, a take-over, `scaler replay`) fails or retries rather than hang. Here the server is frozen."""
    monkeypatch.setattr(stream, "STALL_S", 1.0)
    async with NatsServer(tmp_path / "nats") as server, connected(server.url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        # 100 MB of batches: what follows the freeze is more than a client holds unread (nats-py's 64 MB), so
        # the frozen server leaves the read waiting however late a batch is handled on a busy machine.
        for n in range(10_000):
            batch = Batch(key="fn", at_ms=n, cause=f"c{n}".ljust(10_000, "."), events=[])
            await nc.publish(event_subject("fn"), encode_batch(batch))
        await nc.flush()
        await eventually_stored(js, 10_000)

        def freeze_on_the_way(seq: int, batch: Batch) -> None:
            if seq == 1_000:  # well after the read's own request to the server was answered
                server.proc.send_signal(signal.SIGSTOP)

        try:
            with pytest.raises(Unavailable, match="reading EVENTS stalled"):
                async with asyncio.timeout(30):
                    await stream.read(js, freeze_on_the_way)
        finally:
            server.proc.send_signal(signal.SIGCONT)


async def eventually_stored(js, count: int) -> None:
    async with asyncio.timeout(30):
        while True:
            if (await js.stream_info("EVENTS")).state.messages >= count:
                return
            await asyncio.sleep(0.05)


async def test_replay_writes_every_decision_with_its_reason_to_sqlite(nats_url, tmp_path):
    async with Stack(nats_url) as stack:
        await traffic(stack)
        db = tmp_path / "runs.sqlite"
        code, _, err = await scaler_replay("--nats", nats_url, "--sqlite", str(db))
        assert code == 0, err
        again, _, _ = await scaler_replay("--nats", nats_url, "--sqlite", str(db))  # replaces, does not double
    assert again == 0 and "of the decisions replayed to" in err
    rows = sqlite3.connect(db).execute(
        "SELECT seq, key, cause, event, instance_id, request_id, reason, text FROM decisions ORDER BY seq, decision, n"
    )
    rows = rows.fetchall()
    starts = [r for r in rows if r[3] == "SlotWanted"]
    assert [(r[1], r[2], r[4], r[5]) for r in starts] == [
        ("fn", "assign:r1", "fn-1", "r1"),
        ("fn", "assign:r3", "fn-2", "r3"),
    ]
    assert all(r[6] and r[6] in r[7] for r in starts)  # the policy's reason, also in the words
    kept = [r for r in rows if r[3] == "KeptAlive"]
    assert kept and all(r[6] for r in kept)
    retired = [r for r in rows if r[3] == "InstanceRetired"]
    assert [(r[4], r[6]) for r in retired] == [("fn-2", "need_destroy")]
    assert len(rows) == len(set((r[0], r[7]) for r in rows))  # one row per event, none doubled
