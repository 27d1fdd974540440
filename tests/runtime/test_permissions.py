"""The permissions preflight on a real JetStream: trying what a part needs must never do it."""

import pytest

from scaler.controller.needs import NODE
from scaler.proto.subjects import EVENTS, EVT
from scaler.runtime.bus import connected
from scaler.runtime.permissions import publish, refused
from scaler.store.config import ensure_stream
from scaler.workers import needs
from scaler.workers.gc import GcWorker
from scaler.workers.platform import PlatformWorker


async def test_a_preflight_leaves_events_and_the_workers_consumers_as_it_found_them(nats_url):
    """The workers' preflight once tried the delete of their durable consumer, with no body and no reply: JetStream
    did it, so every worker's start made its consumer again and sent the effects it had not acked as new ones (a
    second CreateSlot for a start a killed worker had made). The node's and the workers' needs tried here, on
    EVENTS with both consumers, one of them holding a batch delivered and not acked."""
    async with connected(nats_url, "test") as nc:
        js = nc.jetstream()
        await ensure_stream(js)
        await js.publish(f"{EVT}.n.0.fn", b"{}")
        kinds = [PlatformWorker, GcWorker]
        held = await js.pull_subscribe(f"{EVT}.>", durable=PlatformWorker.durable, stream=EVENTS)
        await js.pull_subscribe(f"{EVT}.>", durable=GcWorker.durable, stream=EVENTS)
        [delivered] = await held.fetch(1, timeout=5)
        before = await js.stream_info(EVENTS)

        assert await refused(nats_url, [*NODE, *needs.of(kinds)]) == []

        after = await js.stream_info(EVENTS)
        assert (after.config, after.state.messages, after.state.consumer_count) == (
            before.config,
            before.state.messages,
            before.state.consumer_count,
        )
        for kind in kinds:
            info = await js.consumer_info(EVENTS, kind.durable)
            assert info.delivered.stream_seq == (1 if kind is PlatformWorker else 0), kind.durable
        assert (await js.consumer_info(EVENTS, PlatformWorker.durable)).num_ack_pending == 1
        await delivered.ack()


DONE_BARE = ["CONSUMER.DELETE.EVENTS.platform-worker", "STREAM.DELETE.EVENTS", "STREAM.PURGE.EVENTS"]


@pytest.mark.parametrize("verb", DONE_BARE)
def test_a_need_that_trying_would_do_is_refused_when_made(verb):
    with pytest.raises(ValueError, match="cannot be tried without effect"):
        publish(f"$JS.API.{verb}", "anything")
