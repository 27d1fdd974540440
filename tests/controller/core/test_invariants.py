"""Random command sequences never break the core's invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.controller.core.decide import decide
from scaler.controller.core.policy import POLICIES, Capability, get_policy
from scaler.controller.core.state import FnState, Phase, replay
from scaler.proto import commands as c
from tests.controller.core.factories import KEY, META

requests = st.sampled_from([f"r{n}" for n in range(6)])
instances = st.sampled_from([f"{KEY}-{n}" for n in range(1, 7)])
slots = st.sampled_from(["s1", "s2", "s3"])
command = st.one_of(
    st.builds(lambda r, w: c.Assign(key=KEY, request_id=r, meta=META, reply_to=f"to-{w}"), requests, st.integers(0, 2)),
    st.builds(
        lambda r, i, d: c.Idle(key=KEY, request_id=r, instance_id=i, need_destroy=d), requests, instances, st.booleans()
    ),
    st.builds(lambda r, w: c.Cancel(key=KEY, request_id=r, reply_to=f"to-{w}"), requests, st.integers(0, 2)),
    st.builds(lambda i, s: c.SlotReady(key=KEY, instance_id=i, slot_id=f"{i}/{s}"), instances, slots),
    st.builds(
        lambda i, s: c.SlotFailed(key=KEY, instance_id=i, reason="x", slot_id=s), instances, st.sampled_from(["", "sx"])
    ),
    st.builds(lambda i: c.SlotDestroyed(key=KEY, instance_id=i), instances),
    st.just(c.Tick(key=KEY, due_ms=0)),
)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(command, st.integers(0, 400_000)), max_size=40))
def test_invariants_hold_after_any_sequence(policy, steps):
    policy = get_policy(policy)
    s = FnState(key=KEY)
    now = 0
    history = []
    for cmd, dt in steps:
        now += dt
        d = decide(s, cmd, now, policy)
        assert replay(s, d.events) == d.state
        history += d.events
        s = d.state
        busy = [i for i in s.instances.values() if i.phase is Phase.BUSY]
        # one request per instance, one instance per request
        assert len({i.request_id for i in busy}) == len(busy)
        # a queued request is not also being served
        assert not {p.request_id for p in s.queue} & {i.request_id for i in busy}
        # nobody waits while an instance idles; with dedicated starts, a request waits for its own
        # start, and only for that
        own = {i.for_request for i in s.in_phase(Phase.CREATING)} if policy.can(Capability.DEDICATED_STARTS) else set()
        assert not ([p for p in s.queue if p.request_id not in own] and s.in_phase(Phase.IDLE))
        if policy.can(Capability.DEDICATED_STARTS):
            assert all(p.request_id in own for p in s.queue)
        # every idle instance has a keep-alive in the future, and the next wake comes no later
        idle = s.in_phase(Phase.IDLE)
        assert all(i.keep_until_ms > now for i in idle)
        if idle:
            assert d.wake_ms is not None and now < d.wake_ms <= min(i.keep_until_ms for i in idle)
    assert replay(FnState(key=KEY), history) == s
