"""Issue 41, item 3: clocks at a take-over. A node whose wall clock is off writes a function's times on its clock;
the node that loads the function next moves them onto its own (a ClockRebased batch, stored before it serves),
using the NATS server's stamps as the common reference (scaler/controller/clocks.py)."""

import asyncio
import io
import time
from dataclasses import dataclass

import pytest

from scaler import replay
from scaler.controller.core.policy import get_policy
from scaler.controller.metrics import ControllerCollector
from scaler.controller.shell import Controller
from scaler.proto.events import Batch, ClockRebased
from scaler.runtime.bus import connected
from scaler.runtime.clock import Clock
from scaler.store import stream
from scripts.faults import FAKETIME, HAVE_FAKETIME, NO_FAKETIME, released_under_their_callers
from tests.processes import Driver, Parts
from tests.stack import Stack, eventually
from tests.system.test_nodes import shared_between


@dataclass(frozen=True)
class Off(Clock):
    """A node's clock `by_ms` off the true time (behind when negative), its pace the true one's."""

    by_ms: int = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.by_ms


async def rebased(nats_url: str) -> list[Batch]:
    found: list[Batch] = []

    def look(_: int, b: Batch) -> None:
        if any(isinstance(e, ClockRebased) for e in b.events):
            found.append(b)

    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), look)
    return found


@pytest.mark.parametrize("off_s", [-120, 600])
async def test_a_node_loading_what_a_node_off_clock_wrote_moves_its_times_onto_its_own_clock(nats_url, off_s):
    """The writer's clock `off_s` off: the instance it kept alive, loaded by an honest node (from the stream and
    from the snapshot the writer left at its stop), has its keep-alive and its idle time moved by -off_s on the
    loader's clock, one ClockRebased per function before it serves; the loader's state is what replay folds."""
    off_ms = off_s * 1000
    async with Stack(nats_url, clock=Off(by_ms=off_ms)) as writer:
        reply = await writer.assign("r1")
        await writer.idle(reply)
        await writer.settled()
        before = writer.controller.states["fn"].instances[reply.assigment.instance_id]
        assert before.keep_until_ms and abs(before.since_ms - (time.time() * 1000 + off_ms)) < 5_000
        assert abs(writer.controller.partitions.clock_offset_ms - off_ms) < 1_000  # it knows it is off
    assert await rebased(nats_url) == []  # one node, one clock: nothing to move

    loader = Controller(nats_url, get_policy("demo"), Clock())
    await loader.start()
    try:
        await eventually(lambda: "fn" in loader.states)
        after = loader.states["fn"].instances[reply.assigment.instance_id]
        (moved,) = await rebased(nats_url)
        shift = moved.events[0].shift_ms
        assert abs(shift + off_ms) < 1_000  # the writer's offset less the loader's, through the server's clock
        assert after.keep_until_ms == before.keep_until_ms + shift and after.since_ms == before.since_ms + shift
        assert abs(after.since_ms - time.time() * 1000) < 10_000  # idle since a few seconds ago, on this clock
        (offset,) = [m.samples[0].value for m in ControllerCollector(loader).collect() if "clock_offset" in m.name]
        assert abs(offset) < 1  # seconds: this one is not off
        async with connected(nats_url, "test") as nc:
            out = io.StringIO()
            assert await replay.verify(nc, None, out) == 0, out.getvalue()
    finally:
        await loader.stop()


@pytest.mark.skipif(not HAVE_FAKETIME, reason=NO_FAKETIME)
@pytest.mark.parametrize("off_s", [-120])
async def test_a_take_over_from_a_node_whose_wall_clock_is_off_releases_no_request_under_its_caller(
    nats_url, stub, off_s
):
    """Two nodes, node-1's wall clock 120 s behind (libfaketime, monotonic untouched), callers holding instances
    4 s each on functions with a 60 s timeout; node-1 killed -9 while they hold those it assigned. The survivor
    takes them over: none is released as timed out under its caller, no Idle is answered NOT_FOUND, no instance
    is held by two, and replay equals the state."""
    clock = {"LD_PRELOAD": FAKETIME, "FAKETIME": f"{off_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    keys = tuple(f"fn{n}" for n in range(8))
    async with Parts(nats_url, f"127.0.0.1:{stub.port}", nodes=2, env={"node-1": clock}) as parts:
        await shared_between(nats_url, 2)  # node-1 decides for half the functions before the load begins
        # through node-1: its own partitions decided there, the others' forwarded
        driver = Driver(parts.address("node"), keys=keys, clients=6, hold_s=4, function_timeout_s=60, retry_assign=True)
        load = asyncio.create_task(driver.run())
        await eventually(lambda: sum(1 for c in driver.calls if c.got_at) >= 6, 30)
        await parts.kill("node-1")
        killed_at = time.monotonic()
        await eventually(lambda: sum(1 for c in driver.calls if c.idle_at > killed_at + 5) >= 6, 40)
        driver.stop()
        await load
    held = [c for c in driver.calls if 0 < c.got_at < killed_at < c.idle_at]
    assert held  # requests were held across the take-over
    assert [c.error for c in driver.calls if c.error and "NOT_FOUND" in c.error] == []
    assert driver.overlaps() == []
    assert await released_under_their_callers(nats_url, driver.calls) == []
    assert await rebased(nats_url)  # the survivor moved node-1's times
