"""The run's totals kept as decisions change one function at a time: equal, at every step, to what the states hold.

`Totals.change` counts only what differs between a function's state before and after (an assignment or a release
changes an instance's phase, not the memory the function holds); these runs check it against the sums made anew.
"""

import pytest

from scaler.controller.core import folds
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS
from scaler.controller.core.limits import FunctionLimits, Room
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY, META, assign, idle, ready, run

T0 = 1_700_000_000_000


def held(states: dict[str, FnState]) -> tuple[int, int]:
    """(instances, memory in MB) of every function, summed anew."""
    instances = [i for s in states.values() for i in s.instances.values()]
    return len(instances), sum(i.memory_mb for i in instances)


def test_the_memory_held_follows_starts_assignments_releases_and_retirements_of_a_busy_function():
    totals, states, features, now = Totals(), {}, {}, 0
    seen: set[str] = set()
    lives: dict[str, list[int]] = {}  # each instance ever held: its memory, when it came, when it went (or 0)

    def step(cmd: c.AnyCommand) -> FnState:
        nonlocal totals, now
        now += 10 + len(lives)  # uneven steps: the slot time is a sum of unlike spans
        old, was = states.get(cmd.key), features.get(cmd.key, NO_STATS)
        d = decide(old or FnState(key=cmd.key), cmd, now, DEMO, totals, features=was)
        totals = totals.change(old, d.state, was, d.features)
        states[cmd.key], features[cmd.key] = d.state, d.features
        seen.update(type(ev).__name__ for ev in d.events)
        assert (totals.instances, totals.memory_mb) == held(states), f"after {type(cmd).__name__} at {now}"
        for i in d.state.instances.values():
            lives.setdefault(i.id, [i.memory_mb, now, 0])
        for i, life in lives.items():
            if not life[2] and i not in d.state.instances and i.startswith(cmd.key):
                life[2] = now
        slot = sum(m * ((end or now) - began) for m, began, end in lives.values()) / 1024
        assert totals.slot_gb_ms_at(now) == pytest.approx(slot), f"slot time after {type(cmd).__name__} at {now}"
        return d.state

    for key, memory in (("big", 1024), ("small", 128)):
        meta = e.Meta(memory_mb=memory, timeout_s=60)
        for n in range(12):  # a burst: each waits for an instance of its own
            step(c.Assign(key=key, request_id=f"{key}-r{n}", meta=meta, reply_to="to"))
        for inst in states[key].in_phase(Phase.CREATING):
            step(c.SlotReady(key=key, instance_id=inst.id, slot_id=f"slot-{inst.id}", create_ms=100))
        for rounds in range(3):  # warm: each release and assignment changes a phase only
            for inst in states[key].in_phase(Phase.BUSY):
                step(c.Idle(key=key, request_id=inst.request_id, instance_id=inst.id))
                step(c.Assign(key=key, request_id=f"{key}-again-{rounds}-{inst.id}", meta=meta, reply_to="to"))
        for inst in states[key].in_phase(Phase.BUSY)[:4]:  # these retire once released, then go
            step(c.Idle(key=key, request_id=inst.request_id, instance_id=inst.id, need_destroy=True))
            step(c.SlotDestroyed(key=key, instance_id=inst.id, slot_id=f"slot-{inst.id}"))

    assert {"SlotWanted", "InstanceReady", "Assigned", "Released", "InstanceRetired", "InstanceDestroyed"} <= seen
    assert totals.instances == 16 and totals.memory_mb == 8 * 1024 + 8 * 128
    assert sum(1 for _, _, end in lives.values() if end) == 8  # the slot time counted instances gone too


def test_an_instance_destroyed_and_a_bigger_one_started_in_its_place_change_the_memory_held():
    """One decision takes an instance away and starts another in its place, bigger: as many instances, more memory.
    At a cap of one instance, a request asking for more memory waits for the small instance to go."""
    room = Room(limits=FunctionLimits(max_instances=1), throttle_after_ms=60_000)
    states, totals, s, f = {}, Totals(), FnState(key="fn"), NO_STATS
    small, big = e.Meta(memory_mb=256, timeout_s=60), e.Meta(memory_mb=1024, timeout_s=60)
    counts = []
    for n, cmd in enumerate(
        [
            c.Assign(key="fn", request_id="r1", meta=small, reply_to="to"),
            c.SlotReady(key="fn", instance_id="fn-1", slot_id="slot-1", create_ms=100),
            c.Assign(key="fn", request_id="r2", meta=big, reply_to="to"),  # waits: at the cap, and fn-1 too small
            c.Idle(key="fn", request_id="r1", instance_id="fn-1"),  # fn-1 retires: it no longer fits
            c.SlotDestroyed(key="fn", instance_id="fn-1", slot_id="slot-1"),  # gone, and r2 gets its start
        ]
    ):
        d = decide(s, cmd, 10 * n, DEMO, totals, room, f)
        totals = totals.change(states.get("fn"), d.state, f, d.features)
        states["fn"], s, f = d.state, d.state, d.features
        assert (totals.instances, totals.memory_mb) == held(states), f"after {type(cmd).__name__}"
        counts.append({i.id: i.memory_mb for i in s.instances.values()})
    assert counts[-2:] == [{"fn-1": 256}, {"fn-2": 1024}]


def test_a_rebase_moves_the_slot_time_the_totals_count_as_it_moves_the_instances():
    """A ClockRebased moves every live instance's wanted_ms, the same instances before and after: the slot time the
    totals count up to a time on the new clock is still what the function's state counts (FnState.slot_gb_ms_at)."""
    s, decisions = run(assign("r1"), ready("fn-1", "s1"), assign("r2"), idle("r1", "fn-1"), at=T0, step=700)
    f = decisions[-1].features
    assert len(s.instances) == 2
    totals = Totals().change(None, s, None, f)
    now = T0 + 5_000
    assert s.slot_gb_ms_at(now) > 0 and totals.slot_gb_ms_at(now) == pytest.approx(s.slot_gb_ms_at(now))

    shift = 600_000
    moved, f_moved = folds.apply((s, f), e.ClockRebased(at_ms=now, shift_ms=shift))
    assert moved.instances.keys() == s.instances.keys() and moved.instances != s.instances
    totals = totals.change(s, moved, f, f_moved)
    assert totals.slot_gb_ms_at(now + shift) == pytest.approx(moved.slot_gb_ms_at(now + shift))
    assert totals.slot_gb_ms_at(now + shift) == pytest.approx(s.slot_gb_ms_at(now))


def test_an_instance_wanted_at_time_0_holds_slot_time_as_any_other():
    """An offline run's clock starts at 0, and its first call's instance is wanted then: its slot time counts from
    0, alive and once gone, in the function's state and in the totals."""
    s, _ = run(assign("r1"), ready("fn-1", "s1"), at=0, step=1_000)
    assert s.instances["fn-1"].wanted_ms == 0
    assert s.slot_gb_ms_at(4_000) == pytest.approx(META.memory_mb / 1024 * 4_000)
    totals = Totals().change(None, s)
    assert totals.slot_gb_ms_at(4_000) == pytest.approx(s.slot_gb_ms_at(4_000))

    gone, _ = run(
        idle("r1", "fn-1"), c.SlotDestroyed(key=KEY, instance_id="fn-1", slot_id="s1"), at=2_000, step=1_000, s=s
    )
    assert not gone.instances and gone.slot_gb_ms == pytest.approx(META.memory_mb / 1024 * 3_000)  # destroyed at 3 s
