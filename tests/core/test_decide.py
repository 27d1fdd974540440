"""The core's rules, as given (commands so far) / when (one command) / then (events, replies)."""

from typing import NamedTuple

import pytest

from scaler.controller.core.decide import HELD_WAIT_MS, START_MARGIN_MS, decide
from scaler.controller.core.features import UNKNOWN_START_MS
from scaler.controller.core.state import DEFAULT_TIMEOUT_S, FINISHED_GENERATION, FINISHED_KEPT, FnState, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.core.factories import DEMO, KEY, META, POOLED, assign, idle, ready, run

T = 1_000  # when the command of a table row is decided; its given commands came at 0, 10, 20, ...
LEASE = META.timeout_s * 1000 + 30_000  # a busy instance is looked at again when its lease ends
KEEP = 5 * 60_000  # the demo policy's keep-alive
COLD = "cold start: no idle instance"
STARTING = T + UNKNOWN_START_MS + START_MARGIN_MS  # a start decided at T is taken as lost then (looked at again)


def ok(to: str, r: str, instance: str = "", message: str = "") -> c.Reply:
    return c.Reply(to=to, request_id=r, code=c.Code.OK, instance_id=instance, message=message)


class Case(NamedTuple):
    given: list  # commands decided before, 10 ms apart from 0
    when: c.Command  # decided at T
    events: list[e.Event]
    replies: list[c.Reply]
    wake_ms: int | None


CASES = {
    "cold start": Case(
        [],
        assign("r1"),
        [
            e.FunctionSeen(at_ms=T, meta=META),
            e.RequestArrived(at_ms=T, request_id="r1", reply_to="to-r1"),
            e.SlotWanted(at_ms=T, instance_id="fn-1", meta=META, for_request="r1", reason=COLD),
        ],
        [],  # answered when the instance is ready
        STARTING,
    ),
    "ready instance serves the waiting request": Case(
        [assign("r1")],
        ready(),
        [
            e.InstanceReady(at_ms=T, instance_id="fn-1", slot_id="s1", create_ms=100, init_ms=50),
            e.Assigned(at_ms=T, request_id="r1", instance_id="fn-1"),
        ],
        [ok("to-r1", "r1", "fn-1")],
        T + LEASE,
    ),
    "idle keeps the instance alive": Case(
        [assign("r1"), ready()],
        idle("r1"),
        [
            e.Released(at_ms=T, request_id="r1", instance_id="fn-1"),
            e.KeptAlive(at_ms=T, instance_id="fn-1", until_ms=T + KEEP, why="fixed keep-alive 300s"),
        ],
        [ok("to-idle-r1", "r1", "fn-1")],
        T + KEEP,
    ),
    "warm reuse: no new slot": Case(
        [assign("r1"), ready(), idle("r1")],
        assign("r2"),
        [
            e.RequestArrived(at_ms=T, request_id="r2", reply_to="to-r2"),
            e.Assigned(at_ms=T, request_id="r2", instance_id="fn-1"),
        ],
        [ok("to-r2", "r2", "fn-1")],
        T + LEASE,
    ),
    "need_destroy retires": Case(
        [assign("r1"), ready()],
        idle("r1", need_destroy=True, reason="oom"),
        [
            e.Released(at_ms=T, request_id="r1", instance_id="fn-1", reason="oom", need_destroy=True),
            e.InstanceRetired(at_ms=T, instance_id="fn-1", slot_id="s1", reason="need_destroy: oom"),
        ],
        [ok("to-idle-r1", "r1", "fn-1")],
        None,
    ),
    "second concurrent assign starts another": Case(
        [assign("r1")],
        assign("r2"),
        [
            e.RequestArrived(at_ms=T, request_id="r2", reply_to="to-r2"),
            e.SlotWanted(at_ms=T, instance_id="fn-2", meta=META, for_request="r2", reason=COLD),
        ],
        [],
        UNKNOWN_START_MS + START_MARGIN_MS,  # fn-1's, started at 0
    ),
    "idle for an unknown instance changes nothing": Case(
        [assign("r1"), ready()],
        idle("r1", i="nope"),
        [],
        [
            c.Reply(
                to="to-idle-r1",
                request_id="r1",
                code=c.Code.NOT_FOUND,
                message=f"no instance 'nope' for metaKey {KEY!r}",
            )
        ],
        10 + LEASE,  # r1 still holds fn-1, since 10
    ),
    "idle twice is idempotent": Case(
        [assign("r1"), ready(), idle("r1")],
        idle("r1"),
        [],
        [ok("to-idle-r1", "r1", message="instance fn-1 was already released by request r1")],
        20 + KEEP,
    ),
    "retried assign while queued changes nothing": Case(
        [assign("r1")], assign("r1"), [], [], UNKNOWN_START_MS + START_MARGIN_MS
    ),
    "tick before the deadline changes nothing": Case(
        [assign("r1"), ready(), idle("r1")], c.Tick(key=KEY, due_ms=0), [], [], 20 + KEEP
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decide(case):
    s, _ = run(*case.given)
    d = decide(s, case.when, T, DEMO)
    assert (d.events, d.replies, d.wake_ms) == (case.events, case.replies, case.wake_ms)


def test_first_assign_records_meta_then_queues_then_starts():
    _, (d,) = run(assign("r1"))
    assert d.events == [
        e.FunctionSeen(at_ms=0, meta=META),
        e.RequestArrived(at_ms=0, request_id="r1", reply_to="to-r1"),
        e.SlotWanted(at_ms=0, instance_id=f"{KEY}-1", meta=META, for_request="r1", reason=COLD),
    ]


def test_assigned_reply_goes_to_the_waiting_caller():
    _, (_, d) = run(assign("r1", to="inbox.1"), ready())
    assert [(r.to, r.request_id, r.instance_id, r.code) for r in d.replies] == [("inbox.1", "r1", "fn-1", c.Code.OK)]


def test_concurrent_assigns_never_share_an_instance():
    s, ds = run(assign("r1"), assign("r2"), assign("r3"), ready("fn-2", "s2"), ready("fn-1", "s1"), ready("fn-3", "s3"))
    busy = s.in_phase(Phase.BUSY)
    assert sorted(i.request_id for i in busy) == ["r1", "r2", "r3"]
    assert len({i.id for i in busy}) == 3
    assert ds[-1].features.cold_starts == 3


def test_pooled_starts_the_first_ready_instance_serves_the_oldest_waiting_request():
    _, decisions = run(assign("r1"), assign("r2"), ready("fn-2", "s2"), policy=POOLED)
    assigned = [ev for ev in decisions[-1].events if isinstance(ev, e.Assigned)]
    assert [(a.request_id, a.instance_id) for a in assigned] == [("r1", "fn-2")]


def test_dedicated_starts_an_instance_started_for_a_request_serves_only_that_request():
    s, decisions = run(assign("r1"), assign("r2"), ready("fn-2", "s2"))
    assert decisions[-1].events[1:] == [e.Assigned(at_ms=20, request_id="r2", instance_id="fn-2")]
    assert decisions[-1].replies == [ok("to-r2", "r2", "fn-2")]
    assert [p.request_id for p in s.queue] == ["r1"]  # r1 still waits, for fn-1


def test_dedicated_starts_an_instance_freed_meanwhile_goes_idle_for_the_next_arrival():
    s, (*_, freed) = run(assign("r1"), ready("fn-1", "s1"), assign("r2"), idle("r1", "fn-1"))
    assert [type(ev) for ev in freed.events] == [e.Released, e.KeptAlive]  # r2 waits for fn-2, its own
    assert s.instances["fn-1"].phase is Phase.IDLE and [p.request_id for p in s.queue] == ["r2"]
    s, (nxt, own) = run(assign("r3"), ready("fn-2", "s2"), s=s, f=freed.features, at=100)
    assert [(a.request_id, a.instance_id) for a in nxt.events if isinstance(a, e.Assigned)] == [("r3", "fn-1")]
    assert [(a.request_id, a.instance_id) for a in own.events if isinstance(a, e.Assigned)] == [("r2", "fn-2")]
    assert own.features.cold_starts == 2  # one slot per cold Assign, as the Go starter


def test_dedicated_starts_count_each_request_without_a_start_of_its_own():
    # r1's start is ready but r1 was cancelled; r2 has its own start: one start each, none shared
    s, _ = run(assign("r1"), c.Cancel(key=KEY, request_id="r1", reply_to="to-r1"), assign("r2"))
    assert [(i.id, i.for_request) for i in s.in_phase(Phase.CREATING)] == [("fn-1", "r1"), ("fn-2", "r2")]


def test_dedicated_starts_an_instance_whose_request_went_away_goes_idle_when_ready():
    s, (*_, d) = run(assign("r1"), c.Cancel(key=KEY, request_id="r1", reply_to="to-r1"), assign("r2"), ready())
    assert not [ev for ev in d.events if isinstance(ev, e.Assigned)]  # r2 waits for fn-2
    assert s.instances["fn-1"].phase is Phase.IDLE and [p.request_id for p in s.queue] == ["r2"]
    fail = c.SlotFailed(key=KEY, instance_id="fn-1", reason="x", slot_id="s1")
    s, (*_, d) = run(assign("r1"), c.Cancel(key=KEY, request_id="r1", reply_to="to-r1"), assign("r2"), fail)
    assert not [ev for ev in d.events if isinstance(ev, e.RequestFailed)]  # r2's own start is still under way


def test_reuse_picks_the_most_recently_idled_instance():
    s, _ = run(
        assign("r1"), assign("r2"), ready("fn-1", "s1"), ready("fn-2", "s2"), idle("r1", "fn-1"), idle("r2", "fn-2")
    )
    _, (d,) = run(assign("r3"), s=s, at=10_000)
    assert [ev.instance_id for ev in d.events if isinstance(ev, e.Assigned)] == ["fn-2"]


def test_keep_alive_expires_on_tick_and_reuse_before_the_tick_wins():
    s, decisions = run(assign("r1"), ready(), idle("r1"))
    deadline = decisions[-1].wake_ms
    assert deadline == 20 + 5 * 60_000
    reused, _ = run(assign("r2"), s=s, at=deadline + 5)  # the timer is late: the Assign still reuses
    d = decide(reused, c.Tick(key=KEY, due_ms=deadline), deadline + 6, DEMO)
    assert d.events == [] and d.wake_ms == deadline + 5 + META.timeout_s * 1000 + 30_000  # only r2's lease
    d = decide(s, c.Tick(key=KEY, due_ms=deadline), deadline, DEMO)
    why = "keep-alive expired after 300s idle"
    assert d.events == [e.InstanceRetired(at_ms=deadline, instance_id="fn-1", slot_id="s1", reason=why)]
    assert d.state.instances["fn-1"].phase is Phase.RETIRING


def test_destroyed_slot_removes_the_instance():
    s, _ = run(assign("r1"), ready(), idle("r1", need_destroy=True), c.SlotDestroyed(key=KEY, instance_id="fn-1"))
    assert s.instances == {}


def test_idle_errors_are_clear():
    s, _ = run(assign("r1"), ready(), assign("r2"), policy=POOLED)
    d = decide(s, idle("r1", i="fn-9"), 100, DEMO)
    assert d.replies[0].code is c.Code.NOT_FOUND and "fn-9" in d.replies[0].message
    d = decide(s, idle("r2", i="fn-1"), 100, DEMO)  # fn-1 serves r1
    assert d.replies[0].code is c.Code.FAILED_PRECONDITION and "r1" in d.replies[0].message
    moved_on, _ = run(idle("r1"), s=s, policy=POOLED)  # r2 was waiting: fn-1 went straight to it
    d = decide(moved_on, idle("r3", i="fn-1"), 200, DEMO)  # r3 never held fn-1
    assert d.replies[0].code is c.Code.FAILED_PRECONDITION


def test_an_idle_repeated_after_its_release_was_recorded_is_ok_whatever_became_of_the_instance():
    s, _ = run(assign("r1"), ready(), assign("r2"), policy=POOLED)
    moved_on, _ = run(idle("r1"), s=s, policy=POOLED)  # r2 was waiting: fn-1 went straight to it
    again = decide(moved_on, idle("r1"), 200, DEMO)
    assert again.events == [] and again.replies[0].code is c.Code.OK
    gone, _ = run(
        idle("r2", need_destroy=True), c.SlotDestroyed(key=KEY, instance_id="fn-1"), s=moved_on, policy=POOLED
    )
    assert "fn-1" not in gone.instances
    for r in ("r1", "r2"):
        again = decide(gone, idle(r), 300, DEMO)
        assert again.events == [] and again.replies[0].code is c.Code.OK, r
    d = decide(gone, idle("r9"), 300, DEMO)
    assert d.replies[0].code is c.Code.NOT_FOUND


def test_an_assign_repeated_after_its_request_finished_is_refused_even_once_the_instance_moved_on():
    s, _ = run(assign("r1"), ready(), assign("r2"), idle("r1"), policy=POOLED)  # fn-1 now serves r2
    d = decide(s, assign("r1", to="late-retry"), 300, DEMO)
    assert d.events == [] and d.replies[0].code is c.Code.FAILED_PRECONDITION and "fn-1" in d.replies[0].message


def test_a_release_is_remembered_for_its_lease_window_past_many_others_and_then_forgotten():
    """A late retry is known as long as the platform may send it (the 60 s timeout + 30 s grace), however many
    releases came since, up to FINISHED_KEPT; past the window a request of that id is a new one, and its
    release goes with its generation once the newest release of that generation is past the window too."""
    s, _ = run(assign("r1"), ready(), idle("r1"))
    for n in range(300):  # more releases than the 256 once kept
        s, _ = run(assign(f"x{n}"), idle(f"x{n}"), s=s, at=1_000 + n * 100)
    late = decide(s, assign("r1", to="late"), 89_000, DEMO)
    assert late.replies == [c.Reply(to="late", request_id="r1", code=c.Code.FAILED_PRECONDITION,
                                    message="request r1 already finished on instance fn-1")]  # fmt: skip
    s, _ = run(assign("y"), idle("y"), s=s, at=91_000)
    anew = decide(s, assign("r1", to="anew"), 91_000, DEMO)
    assert e.RequestArrived in [type(ev) for ev in anew.events]
    assert [r.code for r in anew.replies] == [c.Code.OK] and anew.replies[0].instance_id
    first = s.finished[0]
    assert "r1" in first and len(first) == FINISHED_GENERATION  # kept with those released just after it
    s, _ = run(assign("z"), idle("z"), s=s, at=max(d.at_ms for d in first.values()) + 90_001)
    assert s.release_of("r1") is None and s.release_of("x299") is not None


def test_a_release_copies_only_the_newest_generation_and_the_bound_drops_the_oldest_whole():
    """A busy function releases all the time: each release must not copy every release kept (2,048 of them)."""
    s, _ = run(assign("r0"), ready(), idle("r0"))
    for n in range(1, FINISHED_KEPT + FINISHED_GENERATION // 2):
        before = s
        s, _ = run(assign(f"r{n}"), idle(f"r{n}"), s=s, at=1_000 + n * 20)
        shared = {id(g) for g in before.finished}
        assert all(id(g) in shared for g in s.finished[:-1])  # the older generations are not copied
    kept = sum(len(g) for g in s.finished)
    assert FINISHED_KEPT - FINISHED_GENERATION < kept <= FINISHED_KEPT
    assert s.release_of("r0") is None and s.release_of(f"r{FINISHED_KEPT}") is not None
    # A reused id, once its release is past the window (though its generation is not): the release moves.
    s, _ = run(assign("r2000"), idle("r2000"), s=s, at=131_500)
    assert s.last_release() == s.release_of("r2000") and sum("r2000" in g for g in s.finished) == 1


def test_a_second_caller_of_a_served_request_holds_it_too_so_the_first_ones_cancel_does_not_free_it():
    s, _ = run(assign("r1", to="first"), ready())
    s, (retry,) = run(assign("r1", to="second"), s=s)
    assert [r.instance_id for r in retry.replies] == ["fn-1"]
    assert s.instances["fn-1"].waiters == ("first", "second")
    s, (cancel,) = run(c.Cancel(key=KEY, request_id="r1", reply_to="first"), s=s)
    assert cancel.events == [] and s.instances["fn-1"].phase is Phase.BUSY


def test_idle_retried_while_the_instance_is_still_idle_is_ok():
    s, _ = run(assign("r1"), ready(), idle("r1"))
    again = decide(s, idle("r1"), 200, DEMO)
    assert again.events == [] and again.replies[0].code is c.Code.OK and "already released" in again.replies[0].message


def test_creation_failure_fails_the_waiting_request_and_destroys_the_slot():
    fail = c.SlotFailed(key=KEY, instance_id="fn-1", reason="Init: boom", slot_id="s1")
    s, (_, d) = run(assign("r1", to="inbox.1"), fail)
    message = "the platform could not start an instance: Init: boom"
    assert d.events == [
        e.InstanceRetired(at_ms=10, instance_id="fn-1", slot_id="s1", reason="creation failed: Init: boom"),
        e.RequestFailed(at_ms=10, request_id="r1", message=message),
    ]
    assert d.replies == [c.Reply(to="inbox.1", request_id="r1", code=c.Code.INTERNAL, message=message)]
    assert s.queue == () and s.instances["fn-1"].phase is Phase.RETIRING


def test_creation_failure_without_slot_leaves_nothing():
    s, (_, _d) = run(assign("r1"), c.SlotFailed(key=KEY, instance_id="fn-1", reason="CreateSlot: full"))
    assert s.instances == {} and s.queue == ()


def test_a_failed_start_of_a_warm_function_leaves_its_request_to_an_instance_that_frees_up():
    """Issue 41, item 5: a start failed while an instance of the function was busy, and its request was failed,
    though the busy one freed up milliseconds later (60 of 1,269 warm requests so). It waits now: a start goes
    out again for it (the platform worker's circuit bounds those), and the instance freed first serves it."""
    s, (*_, failed) = run(
        assign("r1"),
        assign("r2"),
        ready("fn-2", "s2"),
        c.SlotFailed(key=KEY, instance_id="fn-1", reason="x"),
        policy=POOLED,
    )
    # fn-2 went to r1; fn-1 was r1's but r2 now waits on it, and fn-2 is busy: r2 waits
    assert not [ev for ev in failed.events if isinstance(ev, e.RequestFailed)] and failed.replies == []
    assert [ev.for_request for ev in failed.events if isinstance(ev, e.SlotWanted)] == ["r2"]
    s, (freed,) = run(idle("r1", "fn-2"), s=s, at=100, policy=POOLED)
    assert [(ev.request_id, ev.instance_id) for ev in freed.events if isinstance(ev, e.Assigned)] == [("r2", "fn-2")]


def refused(i: str, after_ms: int) -> c.SlotFailed:
    """A start the platform worker refused without a platform call, its circuit open for `after_ms` more."""
    why = "CreateSlot failed 5 times in a row (the latest: CreateSlot: InternalError): not tried"
    return c.SlotFailed(key=KEY, instance_id=i, reason=why, retry_after_ms=after_ms)


def test_a_start_refused_by_an_open_circuit_holds_the_functions_starts_and_its_callers_hear_throttle():
    """Issue 41, item 5: each failed start failed one request and the next Assign started another (2,840 slots in
    15 s for 8 callers). A start the worker's circuit refused holds the function's new starts until it lets one
    through again (`retry_after_ms`, from the command's time: replay holds it too). Meanwhile a request of the
    function starts nothing and, with no instance freeing up, hears Throttle after HELD_WAIT_MS, well within its
    caller's deadline; once the hold is over a request starts an instance again."""
    s, (_, d) = run(assign("r1"), refused("fn-1", 5_000), at=1_000)
    assert [ev for ev in d.events if isinstance(ev, e.StartsHeld)] == [
        e.StartsHeld(at_ms=1_010, until_ms=6_010, reason=refused("fn-1", 0).reason)
    ]
    assert d.replies == [] and s.starts_held_until_ms == 6_010 and d.wake_ms == 1_000 + HELD_WAIT_MS
    s, (throttled,) = run(c.Tick(key=KEY, due_ms=0), s=s, at=1_000 + HELD_WAIT_MS)
    assert [(r.request_id, r.code) for r in throttled.replies] == [("r1", c.Code.THROTTLED)]
    assert "the platform's circuit open (CreateSlot failed 5" in throttled.replies[0].message
    s, (during,) = run(assign("r2"), s=s, at=4_500)
    assert not [ev for ev in during.events if isinstance(ev, e.SlotWanted)] and during.replies == []
    assert [ev.why for ev in during.events if isinstance(ev, e.RequestWaiting)] == [
        "the function's starts are held (the platform's circuit is open): waits for an instance to free up"
    ]
    assert during.wake_ms == 6_010  # the hold's end, before r2's wait is over (4,500 + HELD_WAIT_MS)
    s, (after,) = run(c.Tick(key=KEY, due_ms=0), s=s, at=6_010)  # the hold ends before r2's wait: it gets a start
    assert [ev.for_request for ev in after.events if isinstance(ev, e.SlotWanted)] == ["r2"] and after.replies == []


@pytest.mark.parametrize("policy", [DEMO, POOLED], ids=["dedicated", "pooled"])
def test_while_starts_are_held_a_warm_functions_request_waits_for_an_instance_to_free_up_then_is_throttled(policy):
    """Held starts (the circuit open for 10 s): a request of a function whose instance is busy starts nothing and
    waits for that instance, HELD_WAIT_MS at most, then hears Throttle long before the hold is over (and its
    caller's deadline); a request whose busy instance frees up in time is served by it."""
    s, (*_, failed) = run(assign("r0"), ready(), assign("r1"), refused("fn-2", 10_000), policy=policy)
    assert failed.replies == [] and [p.request_id for p in s.queue] == ["r1"]  # r0 holds fn-1: r1 waits for it
    s, (freed,) = run(idle("r0"), s=s, at=500, policy=policy)
    assert [(ev.request_id, ev.instance_id) for ev in freed.events if isinstance(ev, e.Assigned)] == [("r1", "fn-1")]
    s, (waits,) = run(assign("r2"), s=s, at=1_000, policy=policy)
    assert waits.replies == [] and not [ev for ev in waits.events if isinstance(ev, e.SlotWanted)]
    assert waits.wake_ms == 1_000 + HELD_WAIT_MS
    s, (early,) = run(c.Tick(key=KEY, due_ms=0), s=s, at=1_000 + HELD_WAIT_MS - 1, policy=policy)
    assert early.replies == []
    s, (due,) = run(c.Tick(key=KEY, due_ms=0), s=s, at=1_000 + HELD_WAIT_MS, policy=policy)
    assert [(r.request_id, r.code) for r in due.replies] == [("r2", c.Code.THROTTLED)]
    assert s.queue == () and s.starts_held_until_ms > 1_000 + HELD_WAIT_MS


def test_ready_for_an_unwanted_instance_destroys_its_slot():
    s, (d,) = run(ready("ghost-1", "s9"))
    why = "ready for an instance no longer wanted"
    assert d.events == [e.InstanceRetired(at_ms=0, instance_id="ghost-1@s9", slot_id="s9", reason=why)]
    assert s.instances["ghost-1@s9"].phase is Phase.RETIRING


def created(i: str = "fn-1", slot: str = "s1") -> c.SlotCreated:
    return c.SlotCreated(key=KEY, instance_id=i, slot_id=slot, create_ms=100, reply_to=f"to-created-{i}")


def test_a_created_slot_is_recorded_before_init_and_a_repeat_changes_nothing():
    s, (_, d, again) = run(assign("r1"), created(), created())
    assert d.events == [e.InstanceCreated(at_ms=10, instance_id="fn-1", slot_id="s1", create_ms=100)]
    assert d.replies == [ok("to-created-fn-1", "fn-1", "fn-1")]
    assert again.events == [] and again.replies == d.replies
    assert s.instances["fn-1"].phase is Phase.CREATING and s.instances["fn-1"].slot_id == "s1"


def test_a_slot_created_for_an_instance_no_longer_wanted_is_destroyed_and_init_is_refused():
    _s, (d,) = run(created("ghost-1", "s9"))
    why = "created for an instance no longer wanted"
    assert d.events == [e.InstanceRetired(at_ms=0, instance_id="ghost-1@s9", slot_id="s9", reason=why)]
    assert [r.code for r in d.replies] == [c.Code.FAILED_PRECONDITION]
    _s, (*_, late) = run(assign("r1"), created(), ready(), created())  # a stale repeat once it is ready
    assert late.events == [] and [r.code for r in late.replies] == [c.Code.FAILED_PRECONDITION]


def test_a_second_slot_for_a_creating_instance_replaces_the_first_which_is_destroyed():
    s, (*_, d) = run(assign("r1"), created(slot="s1"), created(slot="s2"))
    assert d.events == [
        e.InstanceRetired(at_ms=20, instance_id="fn-1@s1", slot_id="s1", reason="replaced by s2"),
        e.InstanceCreated(at_ms=20, instance_id="fn-1", slot_id="s2", create_ms=100),
    ]
    assert s.instances["fn-1"].slot_id == "s2" and s.instances["fn-1@s1"].phase is Phase.RETIRING


def test_reports_about_a_slot_given_up_for_another_leave_the_instance_on_the_new_one():
    """A slow worker's Init on the first slot finishes after a second worker replaced that slot: the instance
    stays on the second, the first (being destroyed) is never taken back, and a failure on it fails nothing."""
    s, _ = run(assign("r1"), created(slot="s1"), created(slot="s2"))
    for late in (
        ready(slot="s1"),
        created(slot="s1"),
        c.SlotFailed(key=KEY, instance_id="fn-1", reason="x", slot_id="s1"),
    ):
        d = decide(s, late, 100, DEMO)
        assert d.events == [] and d.state.instances["fn-1"].slot_id == "s2", late
        assert d.state.instances["fn-1"].phase is Phase.CREATING
    assert decide(s, ready(slot="s2"), 100, DEMO).state.instances["fn-1"].phase is Phase.BUSY


def test_a_creation_that_fails_after_its_slot_was_recorded_destroys_that_slot():
    s, (*_, d) = run(assign("r1"), created(), c.SlotFailed(key=KEY, instance_id="fn-1", reason="CreateSlot: full"))
    assert d.events[0] == e.InstanceRetired(
        at_ms=20, instance_id="fn-1", slot_id="s1", reason="creation failed: CreateSlot: full"
    )
    assert s.instances["fn-1"].phase is Phase.RETIRING


def test_repeated_ready_report_is_ignored():
    _s, (*_, d) = run(assign("r1"), ready(), ready())
    assert d.events == []


def test_cancel_frees_what_the_caller_held_or_waited_for():
    s, (_, d) = run(assign("r1", to="inbox.1"), c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"))
    assert d.events == [e.RequestCancelled(at_ms=10, request_id="r1", reason="caller gave up")] and s.queue == ()
    s, (*_, d) = run(assign("r1", to="inbox.1"), ready(), c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"))
    why = "cancelled: caller gave up"
    released = e.Released(at_ms=20, request_id="r1", instance_id="fn-1", status_code=0, reason=why, cancelled=True)
    kept = e.KeptAlive(at_ms=20, instance_id="fn-1", until_ms=20 + KEEP, why="fixed keep-alive 300s")
    assert d.events == [released, kept] and d.replies == [] and s.instances["fn-1"].phase is Phase.IDLE


def test_a_request_whose_assignment_was_cancelled_before_its_caller_got_it_is_served_when_retried():
    """The first attempt's caller gave up (its Cancel came first); the retry is a request never served."""
    cancel = c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    _s, (*_, d) = run(assign("r1", to="inbox.1"), ready(), cancel, assign("r1", to="inbox.2"))
    assert d.events == [
        e.RequestArrived(at_ms=30, request_id="r1", reply_to="inbox.2"),
        e.Assigned(at_ms=30, request_id="r1", instance_id="fn-1"),
    ]
    assert d.replies == [ok("inbox.2", "r1", "fn-1")]
    _s, (*_, done) = run(assign("r1", to="inbox.1"), ready(), idle("r1"), assign("r1", to="inbox.2"))
    assert [r.code for r in done.replies] == [c.Code.FAILED_PRECONDITION], "one that was served is refused"


def test_a_request_served_anew_after_a_cancel_is_found_on_its_new_instance_not_on_the_one_it_left():
    """An idle instance keeps the id of the last request it served. r1 cancelled on fn-1, then served anew on fn-2:
    a further caller of r1 is answered fn-2 (not given a third instance), and a Cancel frees fn-2."""
    cmds = [assign("r1", to="inbox.1"), ready(), assign("r2"), ready("fn-2", "s2")]
    cmds += [c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"), idle("r2", "fn-2"), assign("r1", to="inbox.2")]
    s, (*_, served_anew) = run(*cmds)
    assert served_anew.replies == [ok("inbox.2", "r1", "fn-2")] and s.instances["fn-1"].request_id == "r1"
    d = decide(s, assign("r1", to="inbox.3"), 100, DEMO)
    assert d.events == [e.RequestRetried(at_ms=100, request_id="r1", reply_to="inbox.3")]
    assert d.replies == [c.Reply(to="inbox.3", request_id="r1", instance_id="fn-2")]
    d = decide(s, c.Cancel(key=KEY, request_id="r1", reply_to="inbox.2"), 100, DEMO)
    assert [(type(x), x.instance_id) for x in d.events if isinstance(x, e.Released)] == [(e.Released, "fn-2")]


def test_cancel_by_a_stale_caller_leaves_the_retry_alone():
    s, _ = run(
        assign("r1", to="inbox.1"), assign("r1", to="inbox.2"), c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    )
    assert [p.waiters for p in s.queue] == [("inbox.2",)]


def test_assign_retried_after_assignment_gets_the_same_instance():
    s, _ = run(assign("r1"), ready())
    d = decide(s, assign("r1", to="inbox.again"), 100, DEMO)
    assert d.events == [e.RequestRetried(at_ms=100, request_id="r1", reply_to="inbox.again")]
    assert d.replies == [c.Reply(to="inbox.again", request_id="r1", instance_id="fn-1")]
    assert decide(d.state, assign("r1", to="inbox.again"), 110, DEMO).events == [], "the same caller again: no event"


BIGGER = e.Meta(memory_mb=2048, runtime="python", timeout_s=60)


def test_meta_change_is_recorded_and_used_for_new_instances():
    """The instance being created with the old 512 MB covers no request any more: two start with 2 GB."""
    _s, (*_, d) = run(assign("r1"), assign("r2", meta=BIGGER))
    assert d.events == [
        e.FunctionSeen(at_ms=10, meta=BIGGER),
        e.RequestArrived(at_ms=10, request_id="r2", reply_to="to-r2"),
        e.SlotWanted(at_ms=10, instance_id="fn-2", meta=BIGGER, for_request="r1", reason=COLD),
        e.SlotWanted(at_ms=10, instance_id="fn-3", meta=BIGGER, for_request="r2", reason=COLD),
    ]


def test_an_instance_with_less_memory_than_the_function_now_asks_for_is_never_reused_but_retired():
    _s, (*_, d) = run(assign("r1"), ready(), idle("r1"), assign("r2", meta=BIGGER))
    assert d.events == [
        e.FunctionSeen(at_ms=30, meta=BIGGER),
        e.RequestArrived(at_ms=30, request_id="r2", reply_to="to-r2"),
        e.SlotWanted(at_ms=30, instance_id="fn-2", meta=BIGGER, for_request="r2", reason=COLD),
        e.InstanceRetired(
            at_ms=30, instance_id="fn-1", slot_id="s1", reason="512 MB, less than the function's 2048 MB now"
        ),
    ]
    _s, (*_, smaller) = run(assign("r1", meta=BIGGER), ready(), idle("r1"), assign("r2"))
    assert [ev for ev in smaller.events if isinstance(ev, e.Assigned)] == [
        e.Assigned(at_ms=30, request_id="r2", instance_id="fn-1")
    ], "one with more memory than asked serves"


def test_zero_memory_is_refused():
    d = decide(FnState(key=KEY), assign("r1", meta=e.Meta(memory_mb=0)), 0, DEMO)
    assert d.events == [] and d.replies[0].code is c.Code.INVALID_ARGUMENT


def test_every_caller_of_a_retried_request_gets_the_answer():
    _, (*_, d) = run(assign("r1", to="inbox.1"), assign("r1", to="inbox.2"), ready())
    assert sorted(r.to for r in d.replies) == ["inbox.1", "inbox.2"]
    assert {r.instance_id for r in d.replies} == {"fn-1"}


def test_request_is_cancelled_when_its_last_waiter_leaves():
    s, (*_, d) = run(
        assign("r1", to="inbox.1"),
        assign("r1", to="inbox.2"),
        c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"),
        c.Cancel(key=KEY, request_id="r1", reply_to="inbox.2"),
    )
    assert d.events == [e.RequestCancelled(at_ms=30, request_id="r1", reason="caller gave up")] and s.queue == ()


def test_cancel_of_a_shared_assignment_does_not_free_it():
    s, _ = run(
        assign("r1", to="inbox.1"),
        assign("r1", to="inbox.2"),
        ready(),
        c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"),
    )
    assert s.instances["fn-1"].phase is Phase.BUSY


def test_an_instance_held_past_the_function_timeout_is_freed_and_retired():
    s, (_, d) = run(assign("r1"), ready())
    lease = META.timeout_s * 1000 + 30_000
    assert d.wake_ms == 10 + lease  # the gc worker will tick then
    early = decide(s, c.Tick(key=KEY, due_ms=0), 10 + lease - 1, DEMO)
    assert early.events == []
    late = decide(s, c.Tick(key=KEY, due_ms=0), 10 + lease, DEMO)
    why = "no Idle within the function's 60s timeout"
    assert late.events == [
        e.Released(at_ms=10 + lease, request_id="r1", instance_id="fn-1", status_code=0, reason=why),
        e.InstanceRetired(at_ms=10 + lease, instance_id="fn-1", slot_id="s1", reason=why),
    ]
    assert late.state.instances["fn-1"].phase is Phase.RETIRING
    after = decide(late.state, idle("r1"), 10 + lease + 5, DEMO)  # the lost caller comes back after all
    assert after.events == [] and after.replies[0].code is c.Code.OK


def test_an_instance_of_a_function_without_timeout_has_the_default_lease():
    no_timeout = e.Meta(memory_mb=512, runtime="python", timeout_s=0)
    s, (_, d) = run(assign("r1", meta=no_timeout), ready())
    lease = DEFAULT_TIMEOUT_S * 1000 + 30_000
    assert d.wake_ms == 10 + lease
    late = decide(s, c.Tick(key=KEY, due_ms=0), 10 + lease, DEMO)
    why = f"no Idle within the default {DEFAULT_TIMEOUT_S}s timeout"
    assert [(type(ev), ev.reason) for ev in late.events] == [(e.Released, why), (e.InstanceRetired, why)]


def test_a_start_never_reported_is_retired_at_its_bound_and_its_request_started_for_again():
    """Issue 41, item 1: after a lost tail, an instance stayed *creating* forever and covered its waiting request,
    so nothing started for it. A start not reported within the function's last start plus the margin is lost."""
    s, decisions = run(assign("r1"), ready(), idle("r1"), assign("r2"), assign("r3"), at=0)  # fn-1 serves r2
    started = decisions[-1]
    assert [ev.instance_id for ev in started.events if isinstance(ev, e.SlotWanted)] == ["fn-2"]
    bound = started.features.start_ms + START_MARGIN_MS
    assert started.wake_ms == 40 + bound  # r3's start is looked at again then
    d = decide(s, c.Tick(key=KEY, due_ms=40 + bound - 1), 40 + bound - 1, DEMO, features=started.features)
    assert not any(isinstance(ev, e.InstanceRetired) for ev in d.events)  # not yet: it may still come
    d = decide(s, c.Tick(key=KEY, due_ms=40 + bound), 40 + bound, DEMO, features=started.features)
    retired = [ev for ev in d.events if isinstance(ev, e.InstanceRetired)]
    assert [ev.instance_id for ev in retired] == ["fn-2"] and "a lost start" in retired[0].reason
    again = [ev for ev in d.events if isinstance(ev, e.SlotWanted)]
    assert [(ev.instance_id, ev.for_request) for ev in again] == [("fn-3", "r3")]
    # Should its report come after all, its slot is destroyed, never taken into service.
    late = decide(d.state, ready("fn-2", "s9"), 50 + bound, DEMO, features=d.features)
    assert [(ev.instance_id, ev.slot_id) for ev in late.events if isinstance(ev, e.InstanceRetired)] == [
        ("fn-2@s9", "s9")
    ]
    assert late.state.instances["fn-3"].phase is Phase.CREATING and late.state.queue[0].request_id == "r3"


def test_an_idle_instance_outliving_its_keep_alive_is_kept_while_its_functions_starts_are_held():
    """None could replace it while the platform's circuit holds the function's starts: it stays until a start may
    go again, then retires as usual."""
    s, _ = run(assign("r0"), ready(), assign("r1"), refused("fn-2", 600_000), idle("r0"), idle("r1", "fn-1"))
    held_until, keep = s.starts_held_until_ms, s.instances["fn-1"].keep_until_ms
    assert keep < held_until
    s, (kept,) = run(c.Tick(key=KEY, due_ms=keep), s=s, at=keep)
    assert [(type(ev), ev.until_ms) for ev in kept.events] == [(e.KeptAlive, held_until)]
    s, (retired,) = run(c.Tick(key=KEY, due_ms=held_until), s=s, at=held_until)
    assert [type(ev) for ev in retired.events] == [e.InstanceRetired]
