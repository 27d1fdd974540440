"""Sessions, restart and delete in the pure core: what each decides, as events and replies."""

from scaler.controller.core import folds
from scaler.controller.core.decide import decide, session_wait_ms
from scaler.controller.core.features import NO_STATS
from scaler.controller.core.limits import Room
from scaler.controller.core.state import FnState, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.core.factories import DEMO, KEY, META, idle, ready

ROOM = Room(session_idle_ms=60_000)


class Fn:
    """One function driven command by command, each decision checked to equal its replayed events."""

    def __init__(self) -> None:
        self.s = FnState(key=KEY)
        self.f = NO_STATS  # its features, folded beside the state
        self.events: list[e.Event] = []

    def __call__(self, cmd: c.AnyCommand, at: int):
        d = decide(self.s, cmd, at, DEMO, room=ROOM, features=self.f)
        assert folds.replay(self.s, self.f, d.events) == (d.state, d.features)
        self.s, self.f = d.state, d.features
        self.events += d.events
        return d

    def of(self, kind):
        return [x for x in self.events if isinstance(x, kind)]


def assign(r: str, session: str = "") -> c.Assign:
    return c.Assign(key=KEY, request_id=r, meta=META, reply_to=f"to-{r}", session=session)


def answered(d, r: str) -> str:
    """The instance request `r` was given in this decision ("" if none)."""
    return next((x.instance_id for x in d.replies if x.request_id == r and x.code is c.Code.OK), "")


def two_idle_instances(fn: Fn) -> None:
    """fn-1 and fn-2 idle; fn-2 idled last (the policy's pick without sessions)."""
    fn(assign("a"), 0)
    fn(assign("b"), 1)
    fn(ready("fn-1", "s1"), 100)
    fn(ready("fn-2", "s2"), 101)
    fn(idle("a", "fn-1"), 200)
    fn(idle("b", "fn-2"), 300)


def test_a_session_gets_its_instance_back_though_the_policy_would_pick_another():
    fn = Fn()
    two_idle_instances(fn)
    d = fn(assign("s-1", session="chat"), 400)
    first = answered(d, "s-1")
    assert first == "fn-2"  # the policy's pick: the most recently idled
    fn(idle("s-1", first), 500)
    x = answered(fn(assign("x"), 600), "x")  # a caller without session takes the other one
    assert x != first
    fn(idle("x", x), 650)  # ... which idles last now
    d = fn(assign("s-2", session="chat"), 700)
    assert answered(d, "s-2") == first
    assert [b.instance_id for b in fn.of(e.SessionBound)] == [first]  # bound once, never moved


def test_a_request_without_session_leaves_a_bound_idle_instance_to_its_session():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="chat"), 400)  # takes fn-2
    fn(idle("s-1", "fn-2"), 500)  # fn-2 idled last: the policy would give it to the next caller
    d = fn(assign("x"), 600)
    assert answered(d, "x") == "fn-1"


def test_a_busy_instance_is_waited_for_then_the_session_moves():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="chat"), 400)  # fn-2, still busy
    d = fn(assign("s-2", session="chat"), 410)
    assert d.replies == [] and not any(isinstance(x, e.SlotWanted) for x in d.events)  # waits for fn-2
    wait = session_wait_ms(fn.f)
    assert d.wake_ms == 410 + wait
    d = fn(c.Tick(key=KEY, due_ms=410 + wait), 410 + wait)
    assert answered(d, "s-2") == "fn-1"
    moved = fn.of(e.SessionBound)[-1]
    assert (moved.instance_id, moved.request_id) == ("fn-1", "s-2") and "busy" in moved.why


def test_a_busy_instance_freed_in_time_serves_the_waiting_session():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="chat"), 400)
    fn(assign("s-2", session="chat"), 410)
    d = fn(idle("s-1", "fn-2"), 420)
    assert answered(d, "s-2") == "fn-2"
    assert len(fn.of(e.SessionBound)) == 1


def test_a_binding_ends_after_the_idle_time_and_with_its_instance():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="a"), 400)
    d = fn(idle("s-1", "fn-2"), 500)
    assert d.wake_ms <= 500 + 60_000
    fn(c.Tick(key=KEY, due_ms=60_500), 60_500)
    assert fn.of(e.SessionEnded)[-1].session == "a" and "unused" in fn.of(e.SessionEnded)[-1].reason
    assert fn.s.sessions == {}
    fn(assign("s-2", session="b"), 61_000)
    bound = fn.s.sessions["b"].instance_id
    fn(c.Idle(key=KEY, request_id="s-2", instance_id=bound, need_destroy=True), 61_100)
    assert "b" not in fn.s.sessions and "went" in fn.of(e.SessionEnded)[-1].reason


def test_a_session_keeps_its_binding_while_its_request_runs_past_the_idle_time():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="a"), 400)
    fn(c.Tick(key=KEY, due_ms=80_000), 80_000)  # past the idle time, within the lease
    assert "a" in fn.s.sessions


def test_restart_retires_idle_now_and_busy_when_released():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("r"), 400)  # fn-2 busy
    d = fn(c.Restart(key=KEY, reason="new code", reply_to="op"), 500)
    assert [x.instance_id for x in d.events if isinstance(x, e.InstanceRetired)] == ["fn-1"]
    assert d.replies[0].code is c.Code.OK and "1 idle" in d.replies[0].message
    d = fn(idle("r", "fn-2"), 600)
    assert [x.instance_id for x in d.events if isinstance(x, e.InstanceRetired)] == ["fn-2"]
    d = fn(assign("n"), 700)
    assert any(isinstance(x, e.SlotWanted) for x in d.events)  # fresh instances only


def test_delete_retires_everything_fails_the_waiting_and_forgets():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("r", session="s"), 400)  # busy
    fn(assign("q", session="s"), 401)  # waits for its session's instance
    d = fn(c.Delete(key=KEY, reason="gone", reply_to="op"), 500)
    assert {x.instance_id for x in d.events if isinstance(x, e.InstanceRetired)} == {"fn-1", "fn-2"}
    assert [(x.request_id, x.code) for x in d.replies if x.to == "to-q"] == [("q", c.Code.NOT_FOUND)]
    assert isinstance(d.events[-1], e.FunctionDeleted)
    assert fn.s.meta is None and fn.s.sessions == {} and fn.s.queue == () and fn.f.arrivals == 0
    assert {i.phase for i in fn.s.instances.values()} == {Phase.RETIRING}
    d = fn(assign("again"), 600)  # a tombstone: refused until created again
    assert d.events == [] and d.replies[0].code is c.Code.NOT_FOUND and "was deleted: gone" in d.replies[0].message
    d = fn(c.Create(key=KEY, reply_to="op"), 650)
    assert [type(x) for x in d.events] == [e.FunctionCreated] and d.replies[0].code is c.Code.OK
    d = fn(assign("again"), 700)
    assert isinstance(d.events[0], e.FunctionSeen)
    assert [x.instance_id for x in d.events if isinstance(x, e.SlotWanted)] == ["fn-3"]  # no id used twice
    unknown = decide(FnState(key="nope"), c.Delete(key="nope", reply_to="op"), 0, DEMO)
    assert unknown.replies[0].code is c.Code.NOT_FOUND and unknown.events == []


def test_with_no_other_instance_a_session_waits_then_starts_one_and_moves():
    fn = Fn()
    fn(assign("s-1", session="chat"), 0)
    fn(ready("fn-1", "s1"), 100)  # s-1 on fn-1
    d = fn(assign("s-2", session="chat"), 200)
    assert [type(x) for x in d.events] == [e.RequestArrived, e.RequestWaiting]  # no start while it waits
    assert "fn-1" in d.events[-1].why
    due = 200 + session_wait_ms(fn.f)
    assert d.wake_ms == due
    d = fn(c.Tick(key=KEY, due_ms=due), due)
    assert [x.instance_id for x in d.events if isinstance(x, e.SlotWanted)] == ["fn-2"]
    d = fn(ready("fn-2", "s2"), due + 100)
    assert answered(d, "s-2") == "fn-2" and fn.s.sessions["chat"].instance_id == "fn-2"
