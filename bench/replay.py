"""Replay speed and controller start time, with and without a snapshot, on a stream of 1M events.

    .venv/bin/python -m bench.replay [--events 1000000] [--functions 1000]

Builds the stream with the real core (decide on a synthetic workload: warm reuses, cold starts,
keep-alive expiries and destroys, so the mix of event types is the live one), writes it
straight to JetStream on an embedded nats-server, then measures and prints a table. Not a test:
it takes minutes and its numbers depend on the machine.
"""

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from scaler import replay
from scaler.controller.core.policy import get_policy
from scaler.controller.core.state import Phase
from scaler.controller.ledger import Ledger
from scaler.controller.shell import Controller
from scaler.controller.snapshots import BUCKET
from scaler.proto import commands as c
from scaler.proto.events import Meta, encode_batch
from scaler.proto.subjects import event_subject
from scaler.runtime.bus import connected
from scaler.runtime.natsd import NatsServer
from scaler.store import stream
from scaler.store.config import ensure_stream

POLICY = get_policy("demo")
WINDOW = 2_000  # batches published before waiting for JetStream to have stored them
META = Meta(memory_mb=256, runtime="python", timeout_s=60)


def workload(events: int, functions: int, seed: int = 1) -> tuple[list[tuple[str, bytes]], int]:
    """(subject, encoded batch) in append order, as the controller would have written them."""
    rng = random.Random(seed)
    keys = [f"fn{n:05d}" for n in range(functions)]
    weights = [1 / (n + 1) for n in range(functions)]  # a few hot functions, a long tail
    ledger = Ledger()
    out: list[tuple[str, bytes]] = []
    now, count, req, slot = 1_700_000_000_000, 0, 0, 0

    def run(cmd) -> list:
        nonlocal count
        d = ledger.decide(cmd, now, POLICY)
        batch = ledger.batch(cmd, d, now)
        ledger.commit(cmd, d, len(out) + 1 if batch is not None else None)
        if batch is not None:
            out.append((event_subject(cmd.key, batch.effects), encode_batch(batch)))
            count += len(d.events)
        return d.events

    while count < events:
        now += rng.randint(1, 2_000)
        key = rng.choices(keys, weights)[0]
        if rng.random() < 0.02:  # the gc worker's tick, long after: idle instances expire
            for e in run(c.Tick(key=key, due_ms=now + 400_000)):
                if e.__class__.__name__ == "InstanceRetired":
                    run(c.SlotDestroyed(key=key, instance_id=e.instance_id, slot_id=e.slot_id))
            continue
        req += 1
        r = f"r{req}"
        run(c.Assign(key=key, request_id=r, meta=META, reply_to=f"_INBOX.bench.{req}"))
        for inst in ledger.state(key).in_phase(Phase.CREATING):
            slot += 1
            run(c.SlotReady(key=key, instance_id=inst.id, slot_id=f"slot-{slot}", create_ms=100, init_ms=300))
        held = next(
            (i for i in ledger.state(key).instances.values() if i.request_id == r and i.phase is Phase.BUSY), None
        )
        if held is not None:
            run(c.Idle(key=key, request_id=r, instance_id=held.id, duration_ms=rng.randint(5, 500)))
    return out, count


async def write(js_url: str, batches: list[tuple[str, bytes]]) -> None:
    """Core publishes, in order on one connection, paced so JetStream never drops any: without acks
    there is no back-pressure, and an overloaded server drops what it cannot take."""
    async with connected(js_url, "bench") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        for start in range(0, len(batches), WINDOW):
            for subject, data in batches[start : start + WINDOW]:
                await nc.publish(subject, data)
            await nc.flush()
            await stored(js, min(start + WINDOW, len(batches)))


async def stored(js, count: int) -> None:
    async with asyncio.timeout(30):
        while True:
            if (await js.stream_info("EVENTS")).state.messages >= count:
                return
            await asyncio.sleep(0.005)


async def timed(coro) -> tuple[float, object]:
    began = time.perf_counter()
    result = await coro
    return time.perf_counter() - began, result


async def start_controller(url: str) -> tuple[float, Controller]:
    controller = Controller(url, POLICY)
    seconds, _ = await timed(controller.start())
    return seconds, controller


async def drop_snapshots(url: str) -> None:
    async with connected(url, "bench") as nc:
        await nc.jetstream().delete_object_store(BUCKET)


async def main(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    batches, events = workload(args.events, args.functions)
    built_s = time.perf_counter() - began
    rows: list[tuple[str, str]] = []
    rows.append(("stream", f"{events:,} events in {len(batches):,} batches, {args.functions:,} functions"))
    rows.append(("build with the core (decide)", f"{built_s:.1f} s"))
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        async with NatsServer(Path(tmp) / "nats") as nats:
            seconds, _ = await timed(write(nats.url, batches))
            rate = len(batches) / seconds
            rows.append(("write to JetStream (core publish)", f"{seconds:.1f} s, {rate:,.0f} batches/s"))
            del batches

            async with connected(nats.url, "bench") as nc:
                js = nc.jetstream()
                seconds, _ = await timed(stream.read(js, lambda seq, b: None))
                rows.append(("read + decode (ordered consumer)", f"{seconds:.1f} s, {events / seconds:,.0f} events/s"))
                seconds, r = await timed(replay.replay(nc))
                assert r.events == events, (r.events, events)
                rows.append(("replay: read + decode + fold", f"{seconds:.1f} s, {events / seconds:,.0f} events/s"))

            seconds, controller = await start_controller(nats.url)  # no snapshot yet: every batch is read
            rows.append(("controller start, no snapshot", f"{seconds * 1000:,.0f} ms"))
            snap = controller.snapshot()
            saved_s, _ = await timed(controller.stop())  # gives every partition back, each snapshotted
            rows.append(
                ("stop: snapshots of 32 partitions", f"{saved_s * 1000:,.0f} ms, {len(snap.states):,} functions")
            )
            seconds, controller = await start_controller(nats.url)
            assert controller.loaded_batches == 0
            rows.append(("controller start, from snapshots", f"{seconds * 1000:,.0f} ms"))
            await controller.stop()
            await drop_snapshots(nats.url)
            seconds, controller = await start_controller(nats.url)
            rows.append(("... snapshots deleted: start", f"{seconds * 1000:,.0f} ms (full replay again)"))
            await controller.stop()

    width = max(len(k) for k, _ in rows)
    print(f"| {'measure':<{width}} | result |")
    print(f"|{'-' * (width + 2)}|--------|")
    for k, v in rows:
        print(f"| {k:<{width}} | {v} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--functions", type=int, default=1_000)
    asyncio.run(main(p.parse_args()))
