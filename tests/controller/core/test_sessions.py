"""Sessions, restart and delete in the pure core: what each decides, as events and replies."""

from scaler.controller.core import folds
from scaler.controller.core.decide import decide, session_wait_ms
from scaler.controller.core.features import NO_STATS, START_MARGIN_MS, UNKNOWN_START_MS
from scaler.controller.core.limits import Room
from scaler.controller.core.state import FnState, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY, META, idle, ready
from tests.controller.core.given import Decided, given

ROOM = Room(session_idle_ms=60_000)
LEASE = META.timeout_s * 1000 + 30_000  # a busy instance is looked at again when its lease ends
COLD = "cold start: no idle instance"
KEEP = 5 * 60_000  # the demo policy's keep-alive


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

    def when(self, cmd: c.AnyCommand, at: int) -> Decided:
        """The decision on `cmd`, to be stated whole with `.then(...)`; the function moves on to its state."""
        decided = given(s=self.s, f=self.f, room=ROOM).when(cmd, at)
        self.s, self.f = decided.state, decided.features
        self.events += decided.decision.events
        return decided

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
    fn.when(assign("x"), 600).then(
        events=[
            e.RequestArrived(at_ms=600, request_id="x", reply_to="to-x"),
            e.Assigned(at_ms=600, request_id="x", instance_id="fn-1"),
        ],
        replies=[c.Reply(to="to-x", request_id="x", instance_id="fn-1")],
        wake_ms=500 + ROOM.session_idle_ms,  # the session's binding of fn-2 ends then, unused
    )


def test_a_busy_instance_is_waited_for_then_the_session_moves():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("s-1", session="chat"), 400)  # fn-2, still busy
    wait = session_wait_ms(fn.f)
    fn.when(assign("s-2", session="chat"), 410).then(
        events=[  # waits for fn-2, and starts nothing
            e.RequestArrived(at_ms=410, request_id="s-2", reply_to="to-s-2", session="chat"),
            e.RequestWaiting(
                at_ms=410,
                request_id="s-2",
                expected_ms=410 + wait,
                why=f"waits up to {wait} ms for its session's instance fn-2, busy",
            ),
        ],
        wake_ms=410 + wait,
    )
    moved = "its instance fn-2 stayed busy past the wait"
    fn.when(c.Tick(key=KEY, due_ms=410 + wait), 410 + wait).then(
        events=[
            e.SessionBound(at_ms=410 + wait, session="chat", instance_id="fn-1", request_id="s-2", why=moved),
            e.Assigned(at_ms=410 + wait, request_id="s-2", instance_id="fn-1"),
        ],
        replies=[c.Reply(to="to-s-2", request_id="s-2", instance_id="fn-1")],
        wake_ms=400 + LEASE,  # s-1's lease on fn-2
    )


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
    assert d.wake_ms == 500 + ROOM.session_idle_ms
    fn.when(c.Tick(key=KEY, due_ms=60_500), 60_500).then(
        events=[e.SessionEnded(at_ms=60_500, session="a", reason="unused for 60s")],
        wake_ms=200 + KEEP,  # fn-1's keep-alive, idle since 200
    )
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
    why = "restarted: new code"
    said = "1 idle instance(s) retired, 1 busy one(s) retire when released"
    fn.when(c.Restart(key=KEY, reason="new code", reply_to="op"), 500).then(
        events=[
            e.FunctionRestarted(at_ms=500, reason="new code"),
            e.InstanceRetired(at_ms=500, instance_id="fn-1", slot_id="s1", reason=why),
        ],
        replies=[c.Reply(to="op", request_id="", message=said)],
        wake_ms=400 + LEASE,
    )
    fn.when(idle("r", "fn-2"), 600).then(
        events=[
            e.Released(at_ms=600, request_id="r", instance_id="fn-2"),
            e.InstanceRetired(at_ms=600, instance_id="fn-2", slot_id="s2", reason=f"{why}: retired once released"),
        ],
        replies=[c.Reply(to="to-idle-r", request_id="r", instance_id="fn-2")],
    )
    fn.when(assign("n"), 700).then(  # fresh instances only
        events=[
            e.RequestArrived(at_ms=700, request_id="n", reply_to="to-n"),
            e.SlotWanted(at_ms=700, instance_id="fn-3", meta=META, for_request="n", reason=COLD),
        ],
        wake_ms=700 + 100 + START_MARGIN_MS,  # its start is looked at again then (starts took 100 ms)
    )


def test_delete_retires_everything_fails_the_waiting_and_forgets():
    fn = Fn()
    two_idle_instances(fn)
    fn(assign("r", session="s"), 400)  # busy
    fn(assign("q", session="s"), 401)  # waits for its session's instance
    why = "function deleted: gone"
    fn.when(c.Delete(key=KEY, reason="gone", reply_to="op"), 500).then(
        events=[
            e.RequestFailed(at_ms=500, request_id="q", message=why),
            e.InstanceRetired(at_ms=500, instance_id="fn-1", slot_id="s1", reason=why),
            e.InstanceRetired(at_ms=500, instance_id="fn-2", slot_id="s2", reason=why),
            e.FunctionDeleted(at_ms=500, reason="gone"),
        ],
        replies=[
            c.Reply(to="to-q", request_id="q", code=c.Code.NOT_FOUND, message=why),
            c.Reply(
                to="op", request_id="", message="2 instance(s) retired; its calls are refused until it is created again"
            ),
        ],
    )
    assert fn.s.meta is None and fn.s.sessions == {} and fn.s.queue == () and fn.f.arrivals == 0
    assert {i.phase for i in fn.s.instances.values()} == {Phase.RETIRING}
    refused = (
        "function 'fn' was deleted: gone; it serves calls again once created (`scaler create`) "
        "or called at another version"
    )
    fn.when(assign("again"), 600).then(  # a tombstone: refused until created again
        replies=[c.Reply(to="to-again", request_id="again", code=c.Code.NOT_FOUND, message=refused)]
    )
    fn.when(c.Create(key=KEY, reply_to="op"), 650).then(
        events=[e.FunctionCreated(at_ms=650)],
        replies=[c.Reply(to="op", request_id="", message="created again: its calls are served")],
    )
    fn.when(assign("again"), 700).then(
        events=[
            e.FunctionSeen(at_ms=700, meta=META),
            e.RequestArrived(at_ms=700, request_id="again", reply_to="to-again"),
            e.SlotWanted(at_ms=700, instance_id="fn-3", meta=META, for_request="again", reason=COLD),  # no id twice
        ],
        wake_ms=700 + UNKNOWN_START_MS + START_MARGIN_MS,  # what was learned of its starts went with it
    )
    given(s=FnState(key="nope")).when(c.Delete(key="nope", reply_to="op"), at=0).then(
        replies=[c.Reply(to="op", request_id="", code=c.Code.NOT_FOUND, message="no function 'nope'")]
    )


def test_with_no_other_instance_a_session_waits_then_starts_one_and_moves():
    fn = Fn()
    fn(assign("s-1", session="chat"), 0)
    fn(ready("fn-1", "s1"), 100)  # s-1 on fn-1
    due = 200 + session_wait_ms(fn.f)
    fn.when(assign("s-2", session="chat"), 200).then(
        events=[  # no start while it waits
            e.RequestArrived(at_ms=200, request_id="s-2", reply_to="to-s-2", session="chat"),
            e.RequestWaiting(
                at_ms=200,
                request_id="s-2",
                expected_ms=due,
                why="waits up to 100 ms for its session's instance fn-1, busy",
            ),
        ],
        wake_ms=due,
    )
    fn.when(c.Tick(key=KEY, due_ms=due), due).then(
        events=[e.SlotWanted(at_ms=due, instance_id="fn-2", meta=META, for_request="s-2", reason=COLD)],
        wake_ms=due + 100 + START_MARGIN_MS,  # its start is looked at again then (fn-1's took 100 ms)
    )
    moved = "its instance fn-1 stayed busy past the wait"
    fn.when(ready("fn-2", "s2"), due + 100).then(
        events=[
            e.InstanceReady(at_ms=due + 100, instance_id="fn-2", slot_id="s2", create_ms=100, init_ms=50),
            e.SessionBound(at_ms=due + 100, session="chat", instance_id="fn-2", request_id="s-2", why=moved),
            e.Assigned(at_ms=due + 100, request_id="s-2", instance_id="fn-2"),
        ],
        replies=[c.Reply(to="to-s-2", request_id="s-2", instance_id="fn-2")],
        wake_ms=100 + LEASE,  # s-1's lease on fn-1
    )
    assert fn.s.sessions["chat"].instance_id == "fn-2"
