"""The platform worker's start on a real nats-server and the real stub: Init goes out beside the report of its slot,
and the start's outcome is reported only once that slot is stored."""

import asyncio

from scaler.controller.core.state import Phase
from scaler.proto.events import InstanceCreated, InstanceReady
from scaler.workers import platform
from tests.controller.path.test_lanes import Held, causes
from tests.stack import Stack, eventually


async def test_init_goes_out_beside_its_slots_report_and_the_instance_serves_only_once_the_slot_is_stored(nats_url):
    """A cold start waits for the longer of Init and its slot's report, not for both in turn (in a burst the report
    waits its turn in a busy node); the state still knows the slot of every instance that serves."""
    async with Stack(nats_url) as stack:
        held = Held(stack, InstanceCreated)  # the slot's report, decided, its append held
        pending = asyncio.create_task(stack.assign("r1"))
        await held.reached.wait()
        await eventually(lambda: stack.stub.accounting.inits == 1)  # Init ran to its end meanwhile
        await asyncio.sleep(0.3)  # time enough for a SlotReady, were one sent, to reach the controller
        assert not pending.done(), "answered on an instance whose slot is not stored"
        creating = stack.controller.states["fn"].instances["fn-1"]
        assert creating.phase is Phase.CREATING and not creating.slot_id
        held.release()
        assert (await pending).assigment.instance_id == "fn-1"
        await stack.settled()
        slot = stack.controller.states["fn"].instances["fn-1"].slot_id
        assert set(stack.stub.accounting.live) == {slot}
        assert [s for s, _ in stack.stub.accounting.init_calls] == [slot]  # one Init, on the slot stored
        kinds = [kind for _, ks in await causes(nats_url) for kind in ks]
        assert kinds.index(InstanceCreated.__name__) < kinds.index(InstanceReady.__name__)


async def test_a_report_given_up_is_sent_again_and_the_init_sent_beside_the_first_is_joined(nats_url, monkeypatch):
    """The slot's report waits past the worker's patience (its append held): the worker gives up on it, the start is
    tried again from the slot it made, and the report sent again joins the Init sent beside the first: never a
    second Init on the slot (a platform may refuse that, and count it an error)."""
    monkeypatch.setattr(platform, "REPORT_PATIENCE_S", 0.3)
    async with Stack(nats_url, store_wait_s=30) as stack:  # the Assign waits through the held append
        held = Held(stack, InstanceCreated)
        tries = 0
        send = platform.PlatformWorker._report_and_init

        async def counted(*args, **kwargs):
            nonlocal tries
            tries += 1
            return await send(*args, **kwargs)

        monkeypatch.setattr(platform.PlatformWorker, "_report_and_init", counted)
        pending = asyncio.create_task(stack.assign("r1"))
        await eventually(lambda: tries >= 2)  # given up once, and tried again from the slot it made
        held.release()
        assert (await pending).assigment.instance_id == "fn-1"
        await stack.settled()
        slot = stack.controller.states["fn"].instances["fn-1"].slot_id
        assert stack.stub.accounting.init_calls == [(slot, "fn-1")]
        assert stack.stub.accounting.refused_inits == [] and set(stack.stub.accounting.live) == {slot}
