"""A function another one calls, on a node: the leader's return cues its follower, which is pre-warmed; and so
when the two are on different nodes.

The follower's history (a lead that held in every trial) comes from the offline simulator, stored as the node's
own batches would be; then the leader is called through gRPC, and the node cues the follower on its own."""

from dataclasses import dataclass

from scaler.controller.core.policy import get_policy
from scaler.controller.shell import Controller
from scaler.proto.events import Cued, SlotWanted, encode_batch
from scaler.proto.subjects import NO_EFFECTS, event_subject, function_events
from scaler.replay import explain
from scaler.runtime.bus import connected
from scaler.runtime.clock import Clock
from scaler.simulator.dataset import Dataset
from scaler.simulator.offline import Simulation
from scaler.store import stream
from scaler.store.config import ensure_stream
from tests.simulator.test_learned_offline import chained
from tests.stack import Stack, eventually
from tests.store.test_group_commit import stored
from tests.system.test_nodes import shared_between

LEAD_MS = 400
# The nodes' clock, a tenth of the wall's speed: a cue is worth something within FOLLOW_MS (1 s) of its
# leader's return, which a loaded machine may pass between the two on the wall clock. At this speed a node
# takes stamps as they are (no rebase), so the history the simulator wrote minutes ago reads as such.
SLOW = Clock(speed=0.1)


@dataclass(frozen=True)
class OnTheClock(Dataset):
    """A trace the offline simulator runs at its own times, not from 0: the node's clock's, so the history it
    writes is recent to the node (which forgets a function idle for a day)."""

    @property
    def start_ms(self) -> int:
        return 0


async def seeded(url: str, clock: Clock = SLOW) -> Simulation:
    """The offline run of a leader and its follower, ending minutes ago, its batches appended to the stream in
    the order decided: as history only, on subjects no worker acts on (its slots were the simulator's)."""
    trace = chained(LEAD_MS)
    at_ms = clock.now_ms() - trace.span_ms - 10 * 60_000
    trace = chained(LEAD_MS, at_ms=at_ms)
    sim = Simulation(OnTheClock(trace.name, trace.metas, trace.requests), get_policy("learned"))
    batches, command = [], sim.command

    def recorded(cmd, now):
        d = command(cmd, now)
        if (batch := sim.ledger.batch(cmd, d, now)) is not None:
            batches.append(batch)
        return d

    sim.command = recorded
    sim.run()
    async with connected(url, "test") as nc:
        await ensure_stream(nc.jetstream())
        last: dict[str, int] = {}
        for b in batches:
            data, subject = encode_batch(b), event_subject(b.key, NO_EFFECTS)
            last[b.key] = await stream.append(nc, subject, data, function_events(b.key), last.get(b.key, 0), 10)
    return sim


async def test_a_leaders_return_prewarms_its_follower_on_the_node(nats_url):
    sim = await seeded(nats_url)
    lead = sim.ledger.features_of("follower").leaders
    assert [(x.key, x.hits == x.trials) for x in lead] == [("leader", True)]
    history = len(await stored(nats_url, "follower"))
    async with Stack(nats_url, sim.dataset.metas, policy="learned", clock=SLOW) as stack:
        follower = stack.controller.states["follower"]
        followed = stack.controller.ledger.features_of("follower").leaders
        assert followed == lead and follower.nothing_live()  # rebuilt from the stream, quiet
        await stack.idle(await stack.assign("live-1", key="leader", memory_mb=512))
        await prewarmed_for_the_leader(stack.controller, nats_url, history)


async def test_a_leaders_return_on_another_node_prewarms_its_follower(nats_url):
    """The first node holds partitions 0-15 once a second one shares them, the second 16-31: the follower's
    (6) and the leader's (23). Without the returns told across nodes, the follower is never cued."""
    sim = await seeded(nats_url)
    history = len(await stored(nats_url, "follower"))
    async with Stack(nats_url, sim.dataset.metas, policy="learned", clock=SLOW) as stack:
        other = Controller(nats_url, get_policy("learned"), SLOW)
        await other.start()
        try:
            await shared_between(nats_url, 2)
            await eventually(lambda: stack.controller.serves("follower") and other.serves("leader"))
            assert stack.controller.states["follower"].nothing_live()
            await stack.idle(await stack.assign("live-1", key="leader", memory_mb=512))  # forwarded to the other
            assert other.ledger.features_of("leader").returned_ms, "the call brought the leader back on the other node"
            await prewarmed_for_the_leader(stack.controller, nats_url, history)
        finally:
            await other.stop()


async def prewarmed_for_the_leader(node: Controller, nats_url: str, history: int) -> None:
    """The node cued the follower, which stored the trial and started an instance for the leader's return."""
    await eventually(lambda: not node.states["follower"].nothing_live())
    events = [e for _, b in (await stored(nats_url, "follower"))[history:] for e in b.events]
    cued = [e for e in events if isinstance(e, Cued)]
    assert [e.leader for e in cued] == ["leader"], events
    assert explain.event(cued[0]).startswith("leader came back while this function has no instance")
    started = [e for e in events if isinstance(e, SlotWanted)]
    assert started and "(leader came back, and this function follows it)" in started[0].reason, events
