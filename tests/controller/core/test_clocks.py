"""Issue 41, item 3: a function's times moved onto the clock of the node that loaded it (ClockRebased).

The same calls decided on a node whose clock is SKEW behind, then moved by SKEW, must leave exactly the state
they leave on an honest node: every time the state holds (leases, keep-alives, waiting requests, releases,
sessions, the hold of starts, and in the features beside it, the arrivals and ends) moved, every duration kept.
"""

import pytest

from scaler.controller.core import folds
from scaler.controller.core.decide import decide
from scaler.controller.core.features import NO_STATS
from scaler.controller.core.folds import Folded
from scaler.controller.core.state import FnState
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, KEY, META, assign, idle, ready, run

SKEW = 120_000
T0 = 1_700_000_000_000


def folded(*cmds, at: int, step: int = 10) -> Folded:
    """The function's state and features once the calls are decided."""
    s, decisions = run(*cmds, at=at, step=step)
    return s, decisions[-1].features


def rebased(fn: Folded, shift_ms: int, at_ms: int = T0 + 10_000) -> Folded:
    return folds.apply(fn, e.ClockRebased(at_ms=at_ms, shift_ms=shift_ms))


def tick(fn: Folded, now: int):
    s, f = fn
    return decide(s, c.Tick(key=KEY, due_ms=now), now, DEMO, features=f)


def calls() -> list:
    """A function with something of most kinds of time: instances busy (their leases), requests waiting, releases
    kept for late retries, a session bound, a stat of arrivals and ends, starts held."""
    return [
        c.Assign(key=KEY, request_id="r1", meta=META, reply_to="to-r1", session="s1"),
        ready("fn-1", "s1"),
        idle("r1", "fn-1"),
        assign("r2"),
        assign("r3"),
        ready("fn-2", "s2"),
        assign("r4"),
        c.SlotFailed(key=KEY, instance_id="fn-3", reason="CreateSlot failed", retry_after_ms=5_000),
        assign("r5"),
        idle("r2", "fn-1"),
    ]


def kept_alive() -> list:
    """... and an instance idle, its keep-alive set."""
    return [assign("r1"), ready("fn-1", "s1"), idle("r1", "fn-1")]


@pytest.mark.parametrize("skew", [SKEW, -SKEW, 600_000, -600_000])
def test_a_rebase_moves_every_time_so_the_state_is_the_one_an_honest_clock_leaves(skew):
    skewed = folded(*calls(), at=T0 - skew, step=700)
    honest = folded(*calls(), at=T0, step=700)
    (s, f) = honest
    assert skewed[0] != s and skewed[1] != f  # the test sees the times, in the state and in the features
    assert s.queue and any(i.busy for i in s.instances.values()) and s.sessions
    assert s.starts_held_until_ms and s.finished and f.last_arrival_ms and f.last_end_ms
    assert rebased(skewed, skew) == honest

    skewed = folded(*kept_alive(), at=T0 - skew)
    honest = folded(*kept_alive(), at=T0)
    assert honest[0].instances["fn-1"].keep_until_ms
    assert rebased(skewed, skew) == honest


@pytest.mark.parametrize("skew", [SKEW, -600_000])
def test_a_decision_after_a_rebase_equals_the_one_on_an_honest_state(skew):
    """A Tick past the requests' lease: both release the same requests at the same time, no sooner on the state
    written by the skewed node; the same at the keep-alive and at rest."""
    moved = rebased(folded(*calls(), at=T0 - skew, step=700), skew)
    honest = folded(*calls(), at=T0, step=700)
    kept_moved = rebased(folded(*kept_alive(), at=T0 - skew), skew)
    kept_honest = folded(*kept_alive(), at=T0)
    for later_ms in (5_000, 60_000, 95_000, 10 * 60_000, 2 * 3600_000):
        now = T0 + later_ms
        assert tick(moved, now) == tick(honest, now)  # the events, the state and the features they leave
        assert tick(kept_moved, now) == tick(kept_honest, now)
    assert any(isinstance(ev, e.Released) for ev in tick(honest, T0 + 95_000).events)


def test_without_a_rebase_the_state_a_slow_clock_wrote_releases_a_request_under_its_caller():
    """What the rebase is for: 6 s into a request's 60 s timeout on the writer's clock (120 s behind), the node
    taking over sees the lease 126 s old and releases it; rebased, it keeps it."""
    fn = folded(assign("r1"), ready("fn-1", "s1"), at=T0 - SKEW)
    now = T0 + 6_000
    released = [ev for ev in tick(fn, now).events if isinstance(ev, e.Released)]
    assert [ev.request_id for ev in released] == ["r1"]
    moved = rebased(fn, SKEW, at_ms=now)
    assert not [ev for ev in tick(moved, now).events if isinstance(ev, e.Released)]
    assert moved[0].instances["fn-1"].busy


def test_a_rebase_of_a_state_with_nothing_moves_nothing():
    nothing = (FnState(key=KEY), NO_STATS)
    assert rebased(nothing, SKEW, at_ms=T0) == nothing
