"""Caps and reserved instances: the core never starts past a cap, throttles who waited too long at one,
and keeps the reserved instances of a function ready."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.controller.core import folds
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS, FnStats
from scaler.controller.core.limits import FunctionLimits, Limits, Room
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.core.factories import DEMO, KEY, META, assign, idle, ready

THROTTLE_MS = 5_000


def room(**caps) -> Room:
    return Room(limits=FunctionLimits(**caps), throttle_after_ms=THROTTLE_MS)


def run(cmds, r: Room, s: FnState | None = None, at: int = 0, step: int = 10, f: FnStats = NO_STATS):
    s = s or FnState(key=KEY)
    decisions = []
    for n, cmd in enumerate(cmds):
        d = decide(s, cmd, at + n * step, DEMO, room=r, features=f)
        assert folds.replay(s, f, d.events) == (d.state, d.features)
        decisions.append(d)
        s, f = d.state, d.features
    return s, decisions


def test_past_the_instance_cap_a_request_waits_then_is_throttled():
    s, decisions = run([assign("r1"), assign("r2"), assign("r3")], room(max_instances=2))
    assert [i.for_request for i in s.in_phase(Phase.CREATING)] == ["r1", "r2"]
    third = decisions[-1]
    assert [type(ev) for ev in third.events] == [e.RequestArrived, e.RequestWaiting]
    assert "at the cap (max_instances 2)" in third.events[-1].why
    assert third.wake_ms == 20 + THROTTLE_MS  # r3 arrived at 20
    throttled = decide(s, c.Tick(key=KEY, due_ms=third.wake_ms), third.wake_ms, DEMO, room=room(max_instances=2))
    assert throttled.events == [
        e.RequestFailed(
            at_ms=third.wake_ms,
            request_id="r3",
            message=f"throttled: at the cap (max_instances 2) and no instance freed up within {THROTTLE_MS} ms",
        )
    ]
    assert [(r.to, r.code) for r in throttled.replies] == [("to-r3", c.Code.THROTTLED)]


def test_an_instance_that_frees_up_in_time_serves_the_request_held_at_the_cap():
    r = room(max_instances=1)
    s, _ = run([assign("r1"), ready("fn-1", "s1"), assign("r2")], r)
    s, (freed,) = run([idle("r1")], r, s=s, at=1_000)
    assigned = [ev for ev in freed.events if isinstance(ev, e.Assigned)]
    assert [(a.request_id, a.instance_id) for a in assigned] == [("r2", "fn-1")]
    assert len(s.instances) == 1


def test_the_memory_cap_counts_every_instance_held():
    s, _ = run([assign("r1"), assign("r2"), assign("r3")], room(max_memory_mb=2 * META.memory_mb + 1))
    assert len(s.instances) == 2


def test_caps_over_all_functions_count_what_the_others_hold():
    limits = Limits(max_instances=3, throttle_after_ms=THROTTLE_MS)
    others = Totals(instances=2, memory_mb=1024)  # two instances of other functions
    s = FnState(key=KEY)
    for n, cmd in enumerate([assign("r1"), assign("r2")]):
        held = others.plus(Totals().change(None, s))  # as the ledger counts: every function's instances
        s = decide(s, cmd, n * 10, DEMO, room=Room.of(limits, s, held)).state
    assert len(s.instances) == 1
    assert limits.share(0.5).max_instances == 1 and Limits().share(0.5) == Limits()


def test_reserved_instances_are_started_and_kept():
    r = room(min_warm=2)
    s, _ = run([assign("r1")], r)  # one for r1, and one more to keep two ready
    assert len(s.in_phase(Phase.CREATING)) == 2
    s, _ = run([ready("fn-1", "s1"), ready("fn-2", "s2"), idle("r1")], r, s=s, at=100)
    later = 10 * 60_000
    s, (tick,) = run([c.Tick(key=KEY, due_ms=later)], r, s=s, at=later)
    assert len(s.in_phase(Phase.IDLE)) == 2, "the demo policy's 5-minute keep-alive passed: reserved ones stay"
    assert all("reserved" in ev.why for ev in tick.events if isinstance(ev, e.KeptAlive))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["assign", "ready", "idle", "tick"]), min_size=1, max_size=40), st.integers(1, 3))
def test_no_sequence_of_commands_starts_past_the_cap(kinds, cap):
    r = room(max_instances=cap)
    s, now, n = FnState(key=KEY), 0, 0
    for kind in kinds:
        now += 700
        if kind == "assign":
            n += 1
            cmd = assign(f"r{n}")
        elif kind == "ready" and (creating := s.in_phase(Phase.CREATING)):
            cmd = ready(creating[0].id, f"slot-{creating[0].id}")
        elif kind == "idle" and (busy := s.in_phase(Phase.BUSY)):
            cmd = idle(busy[0].request_id, busy[0].id)
        else:
            cmd = c.Tick(key=KEY, due_ms=now)
        s = decide(s, cmd, now, DEMO, room=r).state
        assert len(s.instances) <= cap


def test_an_idle_function_rests_then_is_forgotten_and_its_next_call_starts_afresh():
    r = Room(rest_after_ms=60_000, forget_after_ms=600_000)
    s, ds = run([assign("r1"), ready("fn-1", "s1"), idle("r1", need_destroy=True)], r)
    s, ds = run([c.SlotDestroyed(key=KEY, instance_id="fn-1", slot_id="s1")], r, s=s, at=100, f=ds[-1].features)
    released = s.release_of("r1")
    assert not s.instances and released.instance_id == "fn-1"
    f = ds[-1].features
    idle_since = f.last_end_ms
    rest = decide(s, c.Tick(key=KEY, due_ms=idle_since + 60_000), idle_since + 60_000, DEMO, room=r, features=f)
    assert rest.events == [e.FunctionRested(at_ms=idle_since + 60_000)]
    # A retry of r1 may still come (its lease window: 60 s timeout + 30 s grace): a rest keeps it.
    assert rest.state.finished == ({"r1": released},) and rest.state.rested and rest.wake_ms == idle_since + 600_000
    gone = decide(rest.state, c.Tick(key=KEY, due_ms=rest.wake_ms), rest.wake_ms, DEMO, room=r, features=rest.features)
    assert gone.events == [e.FunctionForgotten(at_ms=idle_since + 600_000)]
    assert gone.state == FnState(key=KEY) and gone.features == NO_STATS and gone.wake_ms is None
    back = decide(gone.state, assign("r2"), idle_since + 700_000, DEMO, room=r, features=gone.features)
    assert [type(ev) for ev in back.events][:2] == [e.FunctionSeen, e.RequestArrived]
    assert back.features.arrivals == 1, "what was learned went with it"


def test_a_function_with_an_instance_kept_neither_rests_nor_is_forgotten():
    r = Room(rest_after_ms=1_000, forget_after_ms=2_000)
    s, _ = run([assign("r1"), ready("fn-1", "s1"), idle("r1")], r)
    later = decide(s, c.Tick(key=KEY, due_ms=60_000), 60_000, DEMO, room=r)  # demo keeps fn-1 for 5 minutes
    assert not any(isinstance(ev, e.FunctionRested | e.FunctionForgotten) for ev in later.events)
