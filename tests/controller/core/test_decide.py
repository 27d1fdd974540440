"""The core's rules, as given (commands so far) / when (one command) / then (events, replies)."""

from typing import NamedTuple

import msgspec
import pytest

from scaler.controller.core.decide import HELD_WAIT_MS, decide
from scaler.controller.core.features import START_MARGIN_MS, UNKNOWN_START_MS
from scaler.controller.core.limits import NO_ROOM
from scaler.controller.core.state import DEFAULT_TIMEOUT_S, FINISHED_GENERATION, FINISHED_KEPT, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY, META, POOLED, assign, idle, ready, run
from tests.controller.core.given import given

T = 1_000  # when the command of a table row is decided; its given commands came at 0, 10, 20, ...
LEASE = META.timeout_s * 1000 + 30_000  # a busy instance is looked at again when its lease ends
KEEP = 5 * 60_000  # the demo policy's keep-alive
COLD = "cold start: no idle instance"
STARTING = T + UNKNOWN_START_MS + START_MARGIN_MS  # a start decided at T is taken as lost then (looked at again)


def ok(to: str, r: str, instance: str = "", message: str = "") -> c.Reply:
    return c.Reply(to=to, request_id=r, code=c.Code.OK, instance_id=instance, message=message)


def not_found(to: str, r: str, message: str) -> c.Reply:
    return c.Reply(to=to, request_id=r, code=c.Code.NOT_FOUND, message=message)


def refused_(to: str, r: str, message: str) -> c.Reply:
    return c.Reply(to=to, request_id=r, code=c.Code.FAILED_PRECONDITION, message=message)


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
    given(assign("r1", to="inbox.1")).when(ready(), at=10).then(
        events=[
            e.InstanceReady(at_ms=10, instance_id="fn-1", slot_id="s1", create_ms=100, init_ms=50),
            e.Assigned(at_ms=10, request_id="r1", instance_id="fn-1"),
        ],
        replies=[ok("inbox.1", "r1", "fn-1")],
        wake_ms=10 + LEASE,
    )


def test_concurrent_assigns_never_share_an_instance():
    s, ds = run(assign("r1"), assign("r2"), assign("r3"), ready("fn-2", "s2"), ready("fn-1", "s1"), ready("fn-3", "s3"))
    busy = s.in_phase(Phase.BUSY)
    assert sorted(i.request_id for i in busy) == ["r1", "r2", "r3"]
    assert len({i.id for i in busy}) == 3
    assert ds[-1].features.cold_starts == 3


def test_pooled_starts_the_first_ready_instance_serves_the_oldest_waiting_request():
    given(assign("r1"), assign("r2"), policy=POOLED).when(ready("fn-2", "s2"), at=20).then(
        events=[
            e.InstanceReady(at_ms=20, instance_id="fn-2", slot_id="s2", create_ms=100, init_ms=50),
            e.Assigned(at_ms=20, request_id="r1", instance_id="fn-2"),
        ],
        replies=[ok("to-r1", "r1", "fn-2")],
        wake_ms=0 + 10 + START_MARGIN_MS,  # fn-1's start, from 0, bound by the 10 ms fn-2's took
    )


def test_dedicated_starts_an_instance_started_for_a_request_serves_only_that_request():
    d = given(assign("r1"), assign("r2")).when(ready("fn-2", "s2"), at=20)
    d.then(
        events=[
            e.InstanceReady(at_ms=20, instance_id="fn-2", slot_id="s2", create_ms=100, init_ms=50),
            e.Assigned(at_ms=20, request_id="r2", instance_id="fn-2"),
        ],
        replies=[ok("to-r2", "r2", "fn-2")],
        wake_ms=0 + 10 + START_MARGIN_MS,  # r1 still waits, for fn-1
    )
    assert [p.request_id for p in d.state.queue] == ["r1"]


def test_dedicated_starts_an_instance_freed_meanwhile_goes_idle_for_the_next_arrival():
    waiting = given(assign("r1"), ready("fn-1", "s1"), assign("r2"))  # r2 waits for fn-2, its own
    freed = waiting.when(idle("r1", "fn-1"), at=30).then(
        events=[
            e.Released(at_ms=30, request_id="r1", instance_id="fn-1"),
            e.KeptAlive(at_ms=30, instance_id="fn-1", until_ms=30 + KEEP, why="fixed keep-alive 300s"),
        ],
        replies=[ok("to-idle-r1", "r1", "fn-1")],
        wake_ms=20 + 10 + START_MARGIN_MS,  # fn-2's start
    )
    given(s=freed).when(assign("r3"), at=100).then(
        events=[
            e.RequestArrived(at_ms=100, request_id="r3", reply_to="to-r3"),
            e.Assigned(at_ms=100, request_id="r3", instance_id="fn-1"),
        ],
        replies=[ok("to-r3", "r3", "fn-1")],
        wake_ms=20 + 10 + START_MARGIN_MS,
    )
    given(assign("r3"), s=freed, at=100).when(ready("fn-2", "s2"), at=110).then(
        events=[
            e.InstanceReady(at_ms=110, instance_id="fn-2", slot_id="s2", create_ms=100, init_ms=50),
            e.Assigned(at_ms=110, request_id="r2", instance_id="fn-2"),
        ],
        replies=[ok("to-r2", "r2", "fn-2")],
        wake_ms=100 + LEASE,  # r3's lease on fn-1; one slot per cold Assign, as the Go starter
    )


def test_dedicated_starts_count_each_request_without_a_start_of_its_own():
    # r1's start is under way but r1 was cancelled; r2 gets one of its own: one start each, none shared
    cancelled = given(assign("r1"), c.Cancel(key=KEY, request_id="r1", reply_to="to-r1"))
    cancelled.when(assign("r2"), at=20).then(
        events=[
            e.RequestArrived(at_ms=20, request_id="r2", reply_to="to-r2"),
            e.SlotWanted(at_ms=20, instance_id="fn-2", meta=META, for_request="r2", reason=COLD),
        ],
        wake_ms=0 + UNKNOWN_START_MS + START_MARGIN_MS,  # fn-1's
    )


def test_dedicated_starts_an_instance_whose_request_went_away_goes_idle_when_ready():
    gone = given(assign("r1"), c.Cancel(key=KEY, request_id="r1", reply_to="to-r1"), assign("r2"))
    gone.when(ready(), at=30).then(
        events=[  # r2 waits for fn-2
            e.InstanceReady(at_ms=30, instance_id="fn-1", slot_id="s1", create_ms=100, init_ms=50),
            e.KeptAlive(at_ms=30, instance_id="fn-1", until_ms=30 + KEEP, why="fixed keep-alive 300s"),
        ],
        wake_ms=20 + 30 + START_MARGIN_MS,  # fn-2's start, bound by the 30 ms fn-1's took
    )
    fail = c.SlotFailed(key=KEY, instance_id="fn-1", reason="x", slot_id="s1")
    gone.when(fail, at=30).then(  # r2's own start is still under way: r2 does not fail
        events=[e.InstanceRetired(at_ms=30, instance_id="fn-1", slot_id="s1", reason="creation failed: x")],
        wake_ms=20 + UNKNOWN_START_MS + START_MARGIN_MS,
    )


def test_reuse_picks_the_most_recently_idled_instance():
    both = given(
        assign("r1"), assign("r2"), ready("fn-1", "s1"), ready("fn-2", "s2"), idle("r1", "fn-1"), idle("r2", "fn-2")
    )
    both.when(assign("r3"), at=10_000).then(
        events=[
            e.RequestArrived(at_ms=10_000, request_id="r3", reply_to="to-r3"),
            e.Assigned(at_ms=10_000, request_id="r3", instance_id="fn-2"),
        ],
        replies=[ok("to-r3", "r3", "fn-2")],
        wake_ms=10_000 + LEASE,
    )


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
    waiting = given(assign("r1"), ready(), assign("r2"), policy=POOLED)
    starting = 20 + 10 + START_MARGIN_MS  # fn-2's start, for r2
    waiting.when(idle("r1", i="fn-9"), at=100).then(
        replies=[not_found("to-idle-r1", "r1", "no instance 'fn-9' for metaKey 'fn'")], wake_ms=starting
    )
    waiting.when(idle("r2", i="fn-1"), at=100).then(
        replies=[refused_("to-idle-r2", "r2", "instance 'fn-1' serves request 'r1', not request 'r2'")],
        wake_ms=starting,
    )
    moved_on = given(idle("r1"), s=waiting, policy=POOLED)  # r2 was waiting: fn-1 went straight to it
    moved_on.when(idle("r3", i="fn-1"), at=200).then(  # r3 never held fn-1
        replies=[refused_("to-idle-r3", "r3", "instance 'fn-1' serves request 'r2', not request 'r3'")],
        wake_ms=starting,
    )


def test_an_idle_repeated_after_its_release_was_recorded_is_ok_whatever_became_of_the_instance():
    waiting = given(assign("r1"), ready(), assign("r2"), policy=POOLED)
    moved_on = given(idle("r1"), s=waiting, policy=POOLED)  # r2 was waiting: fn-1 went straight to it
    starting = 20 + 10 + START_MARGIN_MS  # fn-2's start, for r2
    already = "instance fn-1 was already released by request {}"
    moved_on.when(idle("r1"), at=200).then(
        replies=[ok("to-idle-r1", "r1", message=already.format("r1"))], wake_ms=starting
    )
    gone = given(idle("r2", need_destroy=True), c.SlotDestroyed(key=KEY, instance_id="fn-1"), s=moved_on, policy=POOLED)
    for r in ("r1", "r2"):
        gone.when(idle(r), at=300).then(replies=[ok(f"to-idle-{r}", r, message=already.format(r))], wake_ms=starting)
    gone.when(idle("r9"), at=300).then(
        replies=[not_found("to-idle-r9", "r9", "no instance 'fn-1' for metaKey 'fn'")], wake_ms=starting
    )


def test_an_assign_repeated_after_its_request_finished_is_refused_even_once_the_instance_moved_on():
    moved_on = given(assign("r1"), ready(), assign("r2"), idle("r1"), policy=POOLED)  # fn-1 now serves r2
    moved_on.when(assign("r1", to="late-retry"), at=300).then(
        replies=[refused_("late-retry", "r1", "request r1 already finished on instance fn-1")],
        wake_ms=20 + 10 + START_MARGIN_MS,  # fn-2's start, for r2
    )


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
    given(s=s).when(assign("r1", to="anew"), at=91_000).then(  # a new request of that id
        events=[
            e.RequestArrived(at_ms=91_000, request_id="r1", reply_to="anew"),
            e.Assigned(at_ms=91_000, request_id="r1", instance_id="fn-1"),
        ],
        replies=[ok("anew", "r1", "fn-1")],
        wake_ms=91_000 + LEASE,
    )
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
    served = given(assign("r1", to="first"), ready())
    retried = served.when(assign("r1", to="second"), at=20).then(
        events=[e.RequestRetried(at_ms=20, request_id="r1", reply_to="second")],
        replies=[ok("second", "r1", "fn-1")],
        wake_ms=10 + LEASE,
    )
    assert retried.state.instances["fn-1"].waiters == ("first", "second")
    given(s=retried).when(c.Cancel(key=KEY, request_id="r1", reply_to="first"), at=30).then(wake_ms=10 + LEASE)


def test_idle_retried_while_the_instance_is_still_idle_is_ok():
    given(assign("r1"), ready(), idle("r1")).when(idle("r1"), at=200).then(
        replies=[ok("to-idle-r1", "r1", message="instance fn-1 was already released by request r1")],
        wake_ms=20 + KEEP,
    )


def test_creation_failure_fails_the_waiting_request_and_destroys_the_slot():
    fail = c.SlotFailed(key=KEY, instance_id="fn-1", reason="Init: boom", slot_id="s1")
    message = "the platform could not start an instance: Init: boom"
    given(assign("r1", to="inbox.1")).when(fail, at=10).then(
        events=[
            e.InstanceRetired(at_ms=10, instance_id="fn-1", slot_id="s1", reason="creation failed: Init: boom"),
            e.RequestFailed(at_ms=10, request_id="r1", message=message),
        ],
        replies=[c.Reply(to="inbox.1", request_id="r1", code=c.Code.INTERNAL, message=message)],
        wake_ms=None,  # the slot's destruction is the platform worker's; nothing to look at again
    )


def test_creation_failure_without_slot_leaves_nothing():
    fail = c.SlotFailed(key=KEY, instance_id="fn-1", reason="CreateSlot: full")
    message = "the platform could not start an instance: CreateSlot: full"
    d = given(assign("r1")).when(fail, at=10)
    d.then(
        events=[
            e.InstanceRetired(at_ms=10, instance_id="fn-1", reason="creation failed: CreateSlot: full"),
            e.RequestFailed(at_ms=10, request_id="r1", message=message),
        ],
        replies=[c.Reply(to="to-r1", request_id="r1", code=c.Code.INTERNAL, message=message)],
        wake_ms=600_000,  # the function is forgotten then, if nothing comes
    )
    assert d.state.instances == {} and d.state.queue == ()


def test_a_failed_start_of_a_warm_function_leaves_its_request_to_an_instance_that_frees_up():
    """Issue 41, item 5: a start failed while an instance of the function was busy, and its request was failed,
    though the busy one freed up milliseconds later (60 of 1,269 warm requests so). It waits now: a start goes
    out again for it (the platform worker's circuit bounds those), and the instance freed first serves it."""
    busy = given(assign("r1"), assign("r2"), ready("fn-2", "s2"), policy=POOLED)  # fn-2 went to r1
    failed = busy.when(c.SlotFailed(key=KEY, instance_id="fn-1", reason="x"), at=30).then(
        events=[  # fn-1 was r1's but r2 waited on it, and fn-2 is busy: r2 waits, and another starts for it
            e.InstanceRetired(at_ms=30, instance_id="fn-1", reason="creation failed: x"),
            e.SlotWanted(at_ms=30, instance_id="fn-3", meta=META, for_request="r2", reason=COLD),
        ],
        wake_ms=30 + 10 + START_MARGIN_MS,
    )
    given(s=failed, policy=POOLED).when(idle("r1", "fn-2"), at=100).then(
        events=[
            e.Released(at_ms=100, request_id="r1", instance_id="fn-2"),
            e.Assigned(at_ms=100, request_id="r2", instance_id="fn-2"),
        ],
        replies=[ok("to-idle-r1", "r1", "fn-2"), ok("to-r2", "r2", "fn-2")],
        wake_ms=30 + 10 + START_MARGIN_MS,
    )


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
    why = refused("fn-1", 0).reason
    held = (
        given(assign("r1"), at=1_000)
        .when(refused("fn-1", 5_000), at=1_010)
        .then(
            events=[
                e.InstanceRetired(at_ms=1_010, instance_id="fn-1", reason=f"creation failed: {why}"),
                e.StartsHeld(at_ms=1_010, until_ms=6_010, reason=why),
            ],
            wake_ms=1_000 + HELD_WAIT_MS,  # r1's wait
        )
    )
    message = (
        f"throttled: no start of the function for 3010 ms more, the platform's circuit open ({why}), "
        f"and no instance freed up within {HELD_WAIT_MS} ms"
    )
    throttled = (
        given(s=held)
        .when(c.Tick(key=KEY, due_ms=0), at=1_000 + HELD_WAIT_MS)
        .then(
            events=[e.RequestFailed(at_ms=1_000 + HELD_WAIT_MS, request_id="r1", message=message)],
            replies=[c.Reply(to="to-r1", request_id="r1", code=c.Code.THROTTLED, message=message)],
            wake_ms=1_000 + 600_000,  # nothing left but to forget the function
        )
    )
    waits = "the function's starts are held (the platform's circuit is open): waits for an instance to free up"
    during = (
        given(s=throttled)
        .when(assign("r2"), at=4_500)
        .then(
            events=[
                e.RequestArrived(at_ms=4_500, request_id="r2", reply_to="to-r2"),
                e.RequestWaiting(at_ms=4_500, request_id="r2", why=waits),
            ],
            wake_ms=6_010,  # the hold's end, before r2's wait is over (4,500 + HELD_WAIT_MS)
        )
    )
    given(s=during).when(c.Tick(key=KEY, due_ms=0), at=6_010).then(  # the hold is over: r2 gets a start
        events=[e.SlotWanted(at_ms=6_010, instance_id="fn-2", meta=META, for_request="r2", reason=COLD)],
        wake_ms=6_010 + UNKNOWN_START_MS + START_MARGIN_MS,
    )


@pytest.mark.parametrize("policy", [DEMO, POOLED], ids=["dedicated", "pooled"])
def test_while_starts_are_held_a_warm_functions_request_waits_for_an_instance_to_free_up_then_is_throttled(policy):
    """Held starts (the circuit open for 10 s): a request of a function whose instance is busy starts nothing and
    waits for that instance, HELD_WAIT_MS at most, then hears Throttle long before the hold is over (and its
    caller's deadline); a request whose busy instance frees up in time is served by it."""
    why = refused("fn-2", 0).reason
    busy = given(assign("r0"), ready(), assign("r1"), policy=policy)  # r0 holds fn-1
    failed = busy.when(refused("fn-2", 10_000), at=30).then(
        events=[
            e.InstanceRetired(at_ms=30, instance_id="fn-2", reason=f"creation failed: {why}"),
            e.StartsHeld(at_ms=30, until_ms=10_030, reason=why),
        ],
        wake_ms=20 + HELD_WAIT_MS,  # r1 waits for fn-1
    )
    freed = (
        given(s=failed, policy=policy)
        .when(idle("r0"), at=500)
        .then(
            events=[
                e.Released(at_ms=500, request_id="r0", instance_id="fn-1"),
                e.Assigned(at_ms=500, request_id="r1", instance_id="fn-1"),
            ],
            replies=[ok("to-idle-r0", "r0", "fn-1"), ok("to-r1", "r1", "fn-1")],
            wake_ms=500 + LEASE,
        )
    )
    waiting = "the function's starts are held (the platform's circuit is open): waits for an instance to free up"
    waits = (
        given(s=freed, policy=policy)
        .when(assign("r2"), at=1_000)
        .then(
            events=[
                e.RequestArrived(at_ms=1_000, request_id="r2", reply_to="to-r2"),
                e.RequestWaiting(at_ms=1_000, request_id="r2", why=waiting),
            ],
            wake_ms=1_000 + HELD_WAIT_MS,
        )
    )
    then = given(s=waits, policy=policy)
    then.when(c.Tick(key=KEY, due_ms=0), at=1_000 + HELD_WAIT_MS - 1).then(wake_ms=1_000 + HELD_WAIT_MS)
    message = (
        f"throttled: no start of the function for 7030 ms more, the platform's circuit open ({why}), "
        f"and no instance freed up within {HELD_WAIT_MS} ms"
    )
    then.when(c.Tick(key=KEY, due_ms=0), at=1_000 + HELD_WAIT_MS).then(
        events=[e.RequestFailed(at_ms=1_000 + HELD_WAIT_MS, request_id="r2", message=message)],
        replies=[c.Reply(to="to-r2", request_id="r2", code=c.Code.THROTTLED, message=message)],
        wake_ms=500 + LEASE,
    )


def test_ready_for_an_unwanted_instance_destroys_its_slot():
    why = "ready for an instance no longer wanted"
    d = given().when(ready("ghost-1", "s9"), at=0)
    d.then(events=[e.InstanceRetired(at_ms=0, instance_id="ghost-1@s9", slot_id="s9", reason=why)])
    assert d.state.instances["ghost-1@s9"].phase is Phase.RETIRING


def created(i: str = "fn-1", slot: str = "s1") -> c.SlotCreated:
    return c.SlotCreated(key=KEY, instance_id=i, slot_id=slot, create_ms=100, reply_to=f"to-created-{i}")


def test_a_created_slot_is_recorded_before_init_and_a_repeat_changes_nothing():
    starting = 0 + UNKNOWN_START_MS + START_MARGIN_MS
    first = given(assign("r1")).when(created(), at=10)
    first.then(
        events=[e.InstanceCreated(at_ms=10, instance_id="fn-1", slot_id="s1", create_ms=100)],
        replies=[ok("to-created-fn-1", "fn-1", "fn-1")],
        wake_ms=starting,
    )
    assert first.state.instances["fn-1"].phase is Phase.CREATING and first.state.instances["fn-1"].slot_id == "s1"
    given(s=first).when(created(), at=20).then(replies=[ok("to-created-fn-1", "fn-1", "fn-1")], wake_ms=starting)


def test_a_slot_created_for_an_instance_no_longer_wanted_is_destroyed_and_init_is_refused():
    why = "created for an instance no longer wanted"
    given().when(created("ghost-1", "s9"), at=0).then(
        events=[e.InstanceRetired(at_ms=0, instance_id="ghost-1@s9", slot_id="s9", reason=why)],
        replies=[refused_("to-created-ghost-1", "ghost-1", "instance ghost-1 is no longer being created")],
    )
    given(assign("r1"), created(), ready()).when(created(), at=30).then(  # a stale repeat once it is ready
        replies=[refused_("to-created-fn-1", "fn-1", "instance fn-1 is no longer being created")],
        wake_ms=20 + LEASE,
    )


def test_a_second_slot_for_a_creating_instance_replaces_the_first_which_is_destroyed():
    d = given(assign("r1"), created(slot="s1")).when(created(slot="s2"), at=20)
    d.then(
        events=[
            e.InstanceRetired(at_ms=20, instance_id="fn-1@s1", slot_id="s1", reason="replaced by s2"),
            e.InstanceCreated(at_ms=20, instance_id="fn-1", slot_id="s2", create_ms=100),
        ],
        replies=[ok("to-created-fn-1", "fn-1", "fn-1")],
        wake_ms=0 + UNKNOWN_START_MS + START_MARGIN_MS,
    )
    assert d.state.instances["fn-1"].slot_id == "s2" and d.state.instances["fn-1@s1"].phase is Phase.RETIRING


def test_reports_about_a_slot_given_up_for_another_leave_the_instance_on_the_new_one():
    """A slow worker's Init on the first slot finishes after a second worker replaced that slot: the instance
    stays on the second, the first (being destroyed) is never taken back, and a failure on it fails nothing."""
    replaced = given(assign("r1"), created(slot="s1"), created(slot="s2"))
    starting = 0 + UNKNOWN_START_MS + START_MARGIN_MS
    replaced.when(ready(slot="s1"), at=100).then(wake_ms=starting)
    replaced.when(created(slot="s1"), at=100).then(
        replies=[refused_("to-created-fn-1", "fn-1", "instance fn-1 is no longer being created")], wake_ms=starting
    )
    failed = c.SlotFailed(key=KEY, instance_id="fn-1", reason="x", slot_id="s1")
    replaced.when(failed, at=100).then(wake_ms=starting)
    assert replaced.when(ready(slot="s2"), at=100).state.instances["fn-1"].phase is Phase.BUSY


def test_a_creation_that_fails_after_its_slot_was_recorded_destroys_that_slot():
    message = "the platform could not start an instance: CreateSlot: full"
    d = given(assign("r1"), created()).when(c.SlotFailed(key=KEY, instance_id="fn-1", reason="CreateSlot: full"), at=20)
    d.then(
        events=[
            e.InstanceRetired(at_ms=20, instance_id="fn-1", slot_id="s1", reason="creation failed: CreateSlot: full"),
            e.RequestFailed(at_ms=20, request_id="r1", message=message),
        ],
        replies=[c.Reply(to="to-r1", request_id="r1", code=c.Code.INTERNAL, message=message)],
    )
    assert d.state.instances["fn-1"].phase is Phase.RETIRING


def test_repeated_ready_report_is_ignored():
    given(assign("r1"), ready()).when(ready(), at=20).then(wake_ms=10 + LEASE)


def test_cancel_frees_what_the_caller_held_or_waited_for():
    cancel = c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    queued = given(assign("r1", to="inbox.1")).when(cancel, at=10)
    queued.then(
        events=[e.RequestCancelled(at_ms=10, request_id="r1", reason="caller gave up")],
        wake_ms=0 + UNKNOWN_START_MS + START_MARGIN_MS,  # fn-1's start goes on: the next request may take it
    )
    assert queued.state.queue == ()
    why = "cancelled: caller gave up"
    held = given(assign("r1", to="inbox.1"), ready()).when(cancel, at=20)
    held.then(
        events=[
            e.Released(at_ms=20, request_id="r1", instance_id="fn-1", status_code=0, reason=why, cancelled=True),
            e.KeptAlive(at_ms=20, instance_id="fn-1", until_ms=20 + KEEP, why="fixed keep-alive 300s"),
        ],
        wake_ms=20 + KEEP,
    )
    assert held.state.instances["fn-1"].phase is Phase.IDLE


def test_a_request_whose_assignment_was_cancelled_before_its_caller_got_it_is_served_when_retried():
    """The first attempt's caller gave up (its Cancel came first); the retry is a request never served."""
    cancel = c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    given(assign("r1", to="inbox.1"), ready(), cancel).when(assign("r1", to="inbox.2"), at=30).then(
        events=[
            e.RequestArrived(at_ms=30, request_id="r1", reply_to="inbox.2"),
            e.Assigned(at_ms=30, request_id="r1", instance_id="fn-1"),
        ],
        replies=[ok("inbox.2", "r1", "fn-1")],
        wake_ms=30 + LEASE,
    )
    given(assign("r1", to="inbox.1"), ready(), idle("r1")).when(assign("r1", to="inbox.2"), at=30).then(
        replies=[refused_("inbox.2", "r1", "request r1 already finished on instance fn-1")],  # it was served
        wake_ms=20 + KEEP,
    )


def test_a_request_served_anew_after_a_cancel_is_found_on_its_new_instance_not_on_the_one_it_left():
    """An idle instance keeps the id of the last request it served. r1 cancelled on fn-1, then served anew on fn-2:
    a further caller of r1 is answered fn-2 (not given a third instance), and a Cancel frees fn-2."""
    cmds = [assign("r1", to="inbox.1"), ready(), assign("r2"), ready("fn-2", "s2")]
    cmds += [c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"), idle("r2", "fn-2")]
    served_anew = (
        given(*cmds)
        .when(assign("r1", to="inbox.2"), at=60)
        .then(
            events=[
                e.RequestArrived(at_ms=60, request_id="r1", reply_to="inbox.2"),
                e.Assigned(at_ms=60, request_id="r1", instance_id="fn-2"),
            ],
            replies=[ok("inbox.2", "r1", "fn-2")],
            wake_ms=60 + LEASE,
        )
    )
    assert served_anew.state.instances["fn-1"].request_id == "r1"
    again = given(s=served_anew)
    again.when(assign("r1", to="inbox.3"), at=100).then(
        events=[e.RequestRetried(at_ms=100, request_id="r1", reply_to="inbox.3")],
        replies=[ok("inbox.3", "r1", "fn-2")],
        wake_ms=60 + LEASE,
    )
    why = "cancelled: caller gave up"
    again.when(c.Cancel(key=KEY, request_id="r1", reply_to="inbox.2"), at=100).then(
        events=[
            e.Released(at_ms=100, request_id="r1", instance_id="fn-2", status_code=0, reason=why, cancelled=True),
            e.KeptAlive(at_ms=100, instance_id="fn-2", until_ms=100 + KEEP, why="fixed keep-alive 300s"),
        ],
        wake_ms=40 + KEEP,  # fn-1's keep-alive, idle since r1's cancel at 40
    )


def test_cancel_by_a_stale_caller_leaves_the_retry_alone():
    s, _ = run(
        assign("r1", to="inbox.1"), assign("r1", to="inbox.2"), c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    )
    assert [p.waiters for p in s.queue] == [("inbox.2",)]


def test_assign_retried_after_assignment_gets_the_same_instance():
    again = given(assign("r1"), ready()).when(assign("r1", to="inbox.again"), at=100)
    again.then(
        events=[e.RequestRetried(at_ms=100, request_id="r1", reply_to="inbox.again")],
        replies=[ok("inbox.again", "r1", "fn-1")],
        wake_ms=10 + LEASE,
    )
    given(s=again).when(assign("r1", to="inbox.again"), at=110).then(  # the same caller again: no event
        replies=[ok("inbox.again", "r1", "fn-1")], wake_ms=10 + LEASE
    )


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
    given(assign("r1", meta=BIGGER), ready(), idle("r1")).when(assign("r2"), at=30).then(
        events=[  # one with more memory than asked serves
            e.FunctionSeen(at_ms=30, meta=META),
            e.RequestArrived(at_ms=30, request_id="r2", reply_to="to-r2"),
            e.Assigned(at_ms=30, request_id="r2", instance_id="fn-1"),
        ],
        replies=[ok("to-r2", "r2", "fn-1")],
        wake_ms=30 + LEASE,
    )


def test_zero_memory_is_refused():
    given().when(assign("r1", meta=e.Meta(memory_mb=0)), at=0).then(
        replies=[
            c.Reply(
                to="to-r1",
                request_id="r1",
                code=c.Code.INVALID_ARGUMENT,
                message="memory_in_mb must be positive, got 0",
            )
        ]
    )


def test_every_caller_of_a_retried_request_gets_the_answer():
    given(assign("r1", to="inbox.1"), assign("r1", to="inbox.2")).when(ready(), at=20).then(
        events=[
            e.InstanceReady(at_ms=20, instance_id="fn-1", slot_id="s1", create_ms=100, init_ms=50),
            e.Assigned(at_ms=20, request_id="r1", instance_id="fn-1"),
        ],
        replies=[ok("inbox.1", "r1", "fn-1"), ok("inbox.2", "r1", "fn-1")],
        wake_ms=20 + LEASE,
    )


def test_request_is_cancelled_when_its_last_waiter_leaves():
    one_left = given(
        assign("r1", to="inbox.1"), assign("r1", to="inbox.2"), c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1")
    )
    one_left.when(c.Cancel(key=KEY, request_id="r1", reply_to="inbox.2"), at=30).then(
        events=[e.RequestCancelled(at_ms=30, request_id="r1", reason="caller gave up")],
        wake_ms=0 + UNKNOWN_START_MS + START_MARGIN_MS,
    )


def test_cancel_of_a_shared_assignment_does_not_free_it():
    shared = given(assign("r1", to="inbox.1"), assign("r1", to="inbox.2"), ready())
    shared.when(c.Cancel(key=KEY, request_id="r1", reply_to="inbox.1"), at=30).then(wake_ms=20 + LEASE)


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
    given(s=late).when(idle("r1"), at=10 + lease + 5).then(  # the lost caller comes back after all
        replies=[ok("to-idle-r1", "r1", message="instance fn-1 was already released by request r1")]
    )


def test_an_instance_of_a_function_without_timeout_has_the_default_lease():
    no_timeout = e.Meta(memory_mb=512, runtime="python", timeout_s=0)
    s, (_, d) = run(assign("r1", meta=no_timeout), ready())
    lease = DEFAULT_TIMEOUT_S * 1000 + 30_000
    assert d.wake_ms == 10 + lease
    why = f"no Idle within the default {DEFAULT_TIMEOUT_S}s timeout"
    given(s=s).when(c.Tick(key=KEY, due_ms=0), at=10 + lease).then(
        events=[
            e.Released(at_ms=10 + lease, request_id="r1", instance_id="fn-1", status_code=0, reason=why),
            e.InstanceRetired(at_ms=10 + lease, instance_id="fn-1", slot_id="s1", reason=why),
        ]
    )


def test_a_start_never_reported_is_retired_at_its_bound_and_its_request_started_for_again():
    """Issue 41, item 1: after a lost tail, an instance stayed *creating* forever and covered its waiting request,
    so nothing started for it. A start not reported within the function's last start plus the margin is lost."""
    served = given(assign("r1"), ready(), idle("r1"), assign("r2"))  # fn-1 serves r2
    bound = served.features.start_ms + START_MARGIN_MS  # r1's start took 10 ms
    lease = served.state.instances["fn-1"].since_ms + served.state.lease_ms()
    started = served.when(assign("r3"), at=40).then(
        events=[
            e.RequestArrived(at_ms=40, request_id="r3", reply_to="to-r3"),
            e.SlotWanted(at_ms=40, instance_id="fn-2", meta=META, for_request="r3", reason=COLD),
        ],
        wake_ms=40 + bound,  # r3's start is looked at again then
    )
    waiting = given(s=started)
    # not yet: it may still come
    waiting.when(c.Tick(key=KEY, due_ms=40 + bound - 1), at=40 + bound - 1).then(wake_ms=40 + bound)
    lost = "not ready within 30.01s (its function's last start and a margin): a lost start"
    retried = waiting.when(c.Tick(key=KEY, due_ms=40 + bound), at=40 + bound).then(
        events=[
            e.InstanceRetired(at_ms=40 + bound, instance_id="fn-2", reason=lost),
            e.SlotWanted(at_ms=40 + bound, instance_id="fn-3", meta=META, for_request="r3", reason=COLD),
        ],
        # fn-3 is given longer: the start given up says starts take at least `bound` (features._unfinished), so
        # the next wake is r2's lease on fn-1, before fn-3's bound
        wake_ms=min(40 + bound + bound + START_MARGIN_MS, lease),
    )
    assert retried.features.start_ms == bound
    # Should its report come after all, its slot is destroyed, never taken into service.
    why = "ready for an instance no longer wanted"
    given(s=retried).when(ready("fn-2", "s9"), at=50 + bound).then(
        events=[e.InstanceRetired(at_ms=50 + bound, instance_id="fn-2@s9", slot_id="s9", reason=why)],
        wake_ms=min(40 + bound + bound + START_MARGIN_MS, lease),  # fn-3 still starts for r3
    )


def test_an_idle_instance_outliving_its_keep_alive_is_kept_while_the_platform_fails_starts_of_any_function():
    """The function's own starts have not failed, but another function's have (the room says so): its idle instance
    could not be replaced, so it is kept until then, and retires as usual once the platform is not failing."""
    warm = given(assign("r0"), ready(), idle("r0"))
    keep = warm.state.instances["fn-1"].keep_until_ms
    failing = msgspec.structs.replace(NO_ROOM, starts_failing_until_ms=keep + 20_000)
    why = "kept while the platform fails starts (none could replace it)"
    given(s=warm.state, room=failing).when(c.Tick(key=KEY, due_ms=keep), at=keep).then(
        events=[e.KeptAlive(at_ms=keep, instance_id="fn-1", until_ms=keep + 20_000, why=why)], wake_ms=keep + 20_000
    )
    retired = given(s=warm.state).when(c.Tick(key=KEY, due_ms=keep), at=keep)
    assert [type(x) for x in retired.decision.events] == [e.InstanceRetired]


def test_an_idle_instance_outliving_its_keep_alive_is_kept_while_its_functions_starts_are_held():
    """None could replace it while the platform's circuit holds the function's starts: it stays until a start may
    go again, then retires as usual."""
    held = given(assign("r0"), ready(), assign("r1"), refused("fn-2", 600_000), idle("r0"), idle("r1", "fn-1"))
    held_until, keep = held.state.starts_held_until_ms, held.state.instances["fn-1"].keep_until_ms
    assert keep < held_until
    why = "kept while the function's starts are held (the platform's circuit is open)"
    kept = held.when(c.Tick(key=KEY, due_ms=keep), at=keep).then(
        events=[e.KeptAlive(at_ms=keep, instance_id="fn-1", until_ms=held_until, why=why)], wake_ms=held_until
    )
    given(s=kept).when(c.Tick(key=KEY, due_ms=held_until), at=held_until).then(
        events=[
            e.InstanceRetired(
                at_ms=held_until, instance_id="fn-1", slot_id="s1", reason="keep-alive expired after 599.98s idle"
            )
        ]
    )
