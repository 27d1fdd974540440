"""Caps and reserved instances: the core never starts past a cap, throttles who waited too long at one,
and keeps the reserved instances of a function ready."""

from hypothesis import given as generated
from hypothesis import settings
from hypothesis import strategies as st

from scaler.controller.core import folds
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS, START_MARGIN_MS, UNKNOWN_START_MS, FnStats
from scaler.controller.core.limits import FunctionLimits, Limits, Room
from scaler.controller.core.state import FnState, Phase
from scaler.controller.core.totals import Totals
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY, META, assign, idle, ready
from tests.controller.core.given import given

THROTTLE_MS = 5_000
COLD = "cold start: no idle instance"


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
    r = room(max_instances=2)
    at_cap = given(assign("r1"), assign("r2"), room=r)
    assert [i.for_request for i in at_cap.state.in_phase(Phase.CREATING)] == ["r1", "r2"]
    why = "at the cap (max_instances 2)"
    third = at_cap.when(assign("r3"), at=20).then(
        events=[
            e.RequestArrived(at_ms=20, request_id="r3", reply_to="to-r3"),
            e.RequestWaiting(at_ms=20, request_id="r3", why=f"{why}: waits for an instance to free up"),
        ],
        wake_ms=20 + THROTTLE_MS,
    )
    message = f"throttled: {why} and no instance freed up within {THROTTLE_MS} ms"
    given(s=third, room=r).when(c.Tick(key=KEY, due_ms=third.wake_ms), at=third.wake_ms).then(
        events=[e.RequestFailed(at_ms=third.wake_ms, request_id="r3", message=message)],
        replies=[c.Reply(to="to-r3", request_id="r3", code=c.Code.THROTTLED, message=message)],
        wake_ms=0 + UNKNOWN_START_MS + START_MARGIN_MS,  # the starts of r1 and r2, looked at again
    )


def test_an_instance_that_frees_up_in_time_serves_the_request_held_at_the_cap():
    r = room(max_instances=1)
    freed = given(assign("r1"), ready("fn-1", "s1"), assign("r2"), room=r).when(idle("r1"), at=1_000)
    freed.then(
        events=[
            e.Released(at_ms=1_000, request_id="r1", instance_id="fn-1"),
            e.Assigned(at_ms=1_000, request_id="r2", instance_id="fn-1"),
        ],
        replies=[
            c.Reply(to="to-idle-r1", request_id="r1", instance_id="fn-1"),
            c.Reply(to="to-r2", request_id="r2", instance_id="fn-1"),
        ],
        wake_ms=1_000 + META.timeout_s * 1000 + 30_000,  # r2's lease
    )
    assert len(freed.state.instances) == 1


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
    kept = given(ready("fn-1", "s1"), ready("fn-2", "s2"), idle("r1"), s=s, at=100, room=r)
    later = 10 * 60_000  # the demo policy's 5-minute keep-alive passed: reserved ones stay
    why = "reserved: the function keeps 2 warm"
    kept.when(c.Tick(key=KEY, due_ms=later), at=later).then(
        events=[
            e.KeptAlive(at_ms=later, instance_id="fn-1", until_ms=later + 60_000, why=why),
            e.KeptAlive(at_ms=later, instance_id="fn-2", until_ms=later + 60_000, why=why),
        ],
        wake_ms=later + 60_000,
    )


@settings(max_examples=60, deadline=None)
@generated(st.lists(st.sampled_from(["assign", "ready", "idle", "tick"]), min_size=1, max_size=40), st.integers(1, 3))
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
    back = idle_since + 700_000
    came_back = given(s=gone, f=gone.features, room=r).when(assign("r2"), at=back)
    came_back.then(
        events=[
            e.FunctionSeen(at_ms=back, meta=META),
            e.RequestArrived(at_ms=back, request_id="r2", reply_to="to-r2"),
            e.SlotWanted(
                at_ms=back, instance_id="fn-1", meta=META, for_request="r2", reason="cold start: no idle instance"
            ),
        ],
        wake_ms=back + UNKNOWN_START_MS + START_MARGIN_MS,  # what was learned of its starts went with it
    )
    assert came_back.features.arrivals == 1, "what was learned went with it"


def test_a_function_with_an_instance_kept_neither_rests_nor_is_forgotten():
    r = Room(rest_after_ms=1_000, forget_after_ms=2_000)
    s, _ = run([assign("r1"), ready("fn-1", "s1"), idle("r1")], r)
    later = decide(s, c.Tick(key=KEY, due_ms=60_000), 60_000, DEMO, room=r)  # demo keeps fn-1 for 5 minutes
    assert not any(isinstance(ev, e.FunctionRested | e.FunctionForgotten) for ev in later.events)
