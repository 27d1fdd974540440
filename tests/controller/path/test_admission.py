"""Admission without a node: a clock that only moves when told, and commands that never leave."""

from scaler.controller.path.admission import Admission
from scaler.proto.commands import Assign, Code, Idle, Reply
from scaler.proto.events import Meta
from tests.clocks import Monotonic


def assign(n: int = 1) -> Assign:
    return Assign(key="fn", request_id=f"r{n}", reply_to="inbox", meta=Meta(memory_mb=128))


def idle() -> Idle:
    return Idle(key="fn", request_id="r1", instance_id="fn-1")


def test_an_assign_is_refused_once_the_oldest_undecided_command_waited_too_long():
    clock = Monotonic()
    a = Admission(max_backlog=100, max_behind_s=2.0, clock=clock)
    first = a.arrived()
    a.arrived()
    clock.advance(1.9)
    assert a.refuse(assign(), "n1") is None
    clock.advance(0.2)
    said = "node n1 is overloaded (2 commands waiting to be decided, 2.1s behind); try again shortly"
    assert a.refuse(assign(), "n1") == Reply(to="inbox", request_id="r1", code=Code.RESOURCE_EXHAUSTED, message=said)
    assert a.refuse(idle(), "n1") is None, "an Idle frees an instance: never refused"
    assert a.refuse(assign(), "n1", store_troubled=True) is None, "the store's backlog is not overload"
    a.decided(first)
    assert a.refuse(assign(), "n1") is not None, "the second command arrived with the first: as far behind"
    assert a.refused == 2


def test_the_backlog_cap_and_a_late_event_loop_refuse_too_and_recover():
    clock = Monotonic()
    a = Admission(max_backlog=2, max_behind_s=2.0, clock=clock)
    tokens = [a.arrived(), a.arrived()]
    assert a.refuse(assign(), "n1") is not None
    for t in tokens:
        a.decided(t)
    assert a.backlog == 0 and a.behind_s() == 0.0 and a.refuse(assign(), "n1") is None
    a.lagged(3.0)
    assert a.refuse(assign(), "n1") is not None
    for _ in range(30):  # falls slowly: a burst of a second or two is absorbed, a lasting lag is not
        a.lagged(0.0)
    assert a.lag_s < 2.0 and a.refuse(assign(), "n1") is None


def test_a_watcher_gone_quiet_is_lag_before_it_says_so():
    """A process stopped for over 2 s: the calls that waited it out may be handled before the watcher's next word, and
    are refused all the same; a watcher stopped with the node says nothing of the loop."""
    clock = Monotonic()
    a = Admission(max_backlog=100, max_behind_s=2.0, clock=clock, watch_every_s=0.05)
    a.lagged(0.0)
    clock.advance(1.9)
    assert a.refuse(assign(), "n1") is None, "quiet for less than max_behind_s past its due"
    clock.advance(0.25)
    refused = a.refuse(assign(), "n1")
    assert refused is not None and refused.code is Code.RESOURCE_EXHAUSTED and "2.1s behind" in refused.message
    a.lagged(0.0)  # its next word counts from then on (here: the loop on time again)
    assert a.refuse(assign(), "n1") is None
    a.unwatched()
    clock.advance(10.0)
    assert a.lag_s == 0.0 and a.refuse(assign(), "n1") is None
