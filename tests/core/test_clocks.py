"""Issue 41, item 3: a function's times moved onto the clock of the node that loaded it (ClockRebased).

The same calls decided on a node whose clock is SKEW behind, then moved by SKEW, must leave exactly the state
they leave on an honest node: every time the state holds (leases, keep-alives, waiting requests, releases,
sessions, the hold of starts, the stats' arrivals) moved, every duration kept.
"""

import pytest

from scaler.controller.core.decide import decide
from scaler.controller.core.state import FnState, apply
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.core.factories import DEMO, KEY, META, assign, idle, ready, run

SKEW = 120_000
T0 = 1_700_000_000_000


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
    skewed, _ = run(*calls(), at=T0 - skew, step=700)
    honest, _ = run(*calls(), at=T0, step=700)
    assert skewed != honest  # the test sees the times
    assert honest.queue and any(i.busy for i in honest.instances.values()) and honest.sessions
    assert honest.starts_held_until_ms and honest.finished and honest.stats.last_arrival_ms
    assert apply(skewed, e.ClockRebased(at_ms=T0 + 10_000, shift_ms=skew)) == honest

    skewed, _ = run(*kept_alive(), at=T0 - skew)
    honest, _ = run(*kept_alive(), at=T0)
    assert honest.instances["fn-1"].keep_until_ms
    assert apply(skewed, e.ClockRebased(at_ms=T0 + 10_000, shift_ms=skew)) == honest


@pytest.mark.parametrize("skew", [SKEW, -600_000])
def test_a_decision_after_a_rebase_equals_the_one_on_an_honest_state(skew):
    """A Tick past the requests' lease: both release the same requests at the same time, no sooner on the state
    written by the skewed node; the same at the keep-alive and at rest."""
    skewed, _ = run(*calls(), at=T0 - skew, step=700)
    honest, _ = run(*calls(), at=T0, step=700)
    rebased = apply(skewed, e.ClockRebased(at_ms=T0 + 10_000, shift_ms=skew))
    kept, _ = run(*kept_alive(), at=T0 - skew)
    kept_rebased = apply(kept, e.ClockRebased(at_ms=T0 + 10_000, shift_ms=skew))
    kept_honest, _ = run(*kept_alive(), at=T0)
    for later_ms in (5_000, 60_000, 95_000, 10 * 60_000, 2 * 3600_000):
        now = T0 + later_ms
        tick = c.Tick(key=KEY, due_ms=now)
        assert decide(rebased, tick, now, DEMO) == decide(honest, tick, now, DEMO)
        assert decide(kept_rebased, tick, now, DEMO) == decide(kept_honest, tick, now, DEMO)
    assert any(isinstance(ev, e.Released) for ev in decide(honest, c.Tick(key=KEY, due_ms=0), T0 + 95_000, DEMO).events)


def test_without_a_rebase_the_state_a_slow_clock_wrote_releases_a_request_under_its_caller():
    """What the rebase is for: 6 s into a request's 60 s timeout on the writer's clock (120 s behind), the node
    taking over sees the lease 126 s old and releases it; rebased, it keeps it."""
    s, _ = run(assign("r1"), ready("fn-1", "s1"), at=T0 - SKEW)
    now = T0 + 6_000
    tick = c.Tick(key=KEY, due_ms=now)
    released = [ev for ev in decide(s, tick, now, DEMO).events if isinstance(ev, e.Released)]
    assert [ev.request_id for ev in released] == ["r1"]
    rebased = apply(s, e.ClockRebased(at_ms=now, shift_ms=SKEW))
    assert not [ev for ev in decide(rebased, tick, now, DEMO).events if isinstance(ev, e.Released)]
    assert rebased.instances["fn-1"].busy


def test_a_rebase_of_a_state_with_nothing_moves_nothing():
    s = FnState(key=KEY)
    assert apply(s, e.ClockRebased(at_ms=T0, shift_ms=SKEW)) == s
