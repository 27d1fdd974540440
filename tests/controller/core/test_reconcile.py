"""Reconcile in the pure core: what the platform lists against what the state holds."""

from scaler.controller.core import reconcile
from scaler.controller.core.decide import decide
from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from scaler.proto.subjects import SYSTEM_KEY
from tests.controller.core.factories import DEMO, KEY, assign, idle, ready, run
from tests.controller.core.given import given

T = 1_000_000  # when the platform listed its slots
GRACE = 30_000


def listing(*slots: c.PlatformSlot, key: str = KEY) -> c.Reconcile:
    return c.Reconcile(key=key, slots=slots, listed_ms=T, grace_ms=GRACE)


def slot(id: str, instance: str = "", age_ms: int = 60_000) -> c.PlatformSlot:
    return c.PlatformSlot(id=id, instance_id=instance, memory_mb=512, created_ms=T - age_ms)


def two_instances_learned() -> tuple[FnState, FnStats]:
    """fn-1 idle on s1, fn-2 busy on s2, both started long before the listing; fn-3 being created since shortly
    before it (a start older than its bound is taken as lost: features.START_MARGIN_MS). With its features."""
    # Built a little before the listing, so fn-1's keep-alive is still running when it is decided.
    s, ds = run(assign("r1"), assign("r2"), ready("fn-1", "s1"), ready("fn-2", "s2"), at=T - 50_000)
    at = T - 10_000
    s, ds = run(assign("r3"), idle("r1", "fn-1"), idle("r3", "fn-1"), s=s, f=ds[-1].features, at=at)  # r3 took fn-1
    assert [i.phase for i in s.instances.values()] == [Phase.IDLE, Phase.BUSY, Phase.CREATING]
    return s, ds[-1].features


def two_instances() -> FnState:
    return two_instances_learned()[0]


def test_everything_in_place_changes_nothing():
    s = two_instances()
    d = decide(s, listing(slot("s1", "fn-1"), slot("s2", "fn-2")), T + 5, DEMO)
    assert d.events == [] and d.state == s


def test_an_instance_whose_slot_is_gone_is_dropped_with_the_reason():
    s, f = two_instances_learned()
    d = given(s=s, f=f).when(listing(slot("s1", "fn-1")), at=T + 5)
    d.then(
        events=[
            e.InstanceDestroyed(
                at_ms=T + 5, instance_id="fn-2", slot_id="s2", reason="slot gone: the platform no longer lists s2"
            )
        ],
        wake_ms=T - 10_000 + 20 + 30_000,  # fn-3's start (r3's, at T - 10,000 + 20), bound by the last start
    )
    assert "fn-3" in d.state.instances  # creating: no slot to miss yet


def test_an_instance_started_after_the_listing_is_not_dropped():
    s, _ = run(assign("r1"), ready("fn-1", "s1"), at=T - 1_000)  # wanted within the grace period
    assert decide(s, listing(), T + 5, DEMO).events == []


def test_a_listing_from_a_gc_worker_whose_clock_is_ahead_of_the_nodes_never_makes_a_new_instance_look_old():
    """Issue 41, item 3: a node 120 s behind the gc worker started fn-1 after the listing (on both clocks), and its
    Reconcile stamped 120 s later than the node's now came in just after: fn-1 is not taken for gone (it was, with
    its request, while its caller held it)."""
    behind = 120_000
    s, _ = run(assign("r1"), ready("fn-1", "s1"), at=T - behind + 100)  # after the listing, on the node's clock
    assert decide(s, listing(), T - behind + 200, DEMO).events == []
    assert s.instances["fn-1"].busy


def test_a_slot_the_state_does_not_know_is_retired_unless_it_may_be_in_flight():
    s = two_instances()
    known = (slot("s1", "fn-1"), slot("s2", "fn-2"))
    cases = {
        "old stray of this function": (slot("s9", "fn-7"), True),
        "young: CreateSlot may have just returned": (slot("s9", "fn-7", age_ms=1_000), False),
        "the slot of an instance being created": (slot("s9", "fn-3"), False),
        "another function's": (slot("s9", "other-1"), False),
        "no instance yet: for the system key to judge": (slot("s9"), False),
    }
    for what, (extra, retired) in cases.items():
        d = decide(s, listing(*known, extra), T + 5, DEMO)
        expected = [
            e.InstanceRetired(
                at_ms=T + 5, instance_id=f"{extra.instance_id}@s9", slot_id="s9", reason="unknown to the state"
            )
        ]
        assert d.events == (expected if retired else []), what


def test_reconcile_twice_is_reconcile_once():
    s = two_instances()
    cmd = listing(slot("s1", "fn-1"), slot("s9", "fn-7"))
    first = decide(s, cmd, T + 5, DEMO)
    assert first.events
    assert decide(first.state, cmd, T + 6, DEMO).events == []


def test_each_slot_goes_to_the_function_its_instance_names_else_to_the_system_key():
    slots = (slot("s1", "fn-1"), slot("s9", "fn-7"), slot("s10"), slot("s11", "gone-fn-2"), slot("s12", "a-b"))
    routed = reconcile.by_function(slots, known=[KEY, "quiet"])
    assert {k: [p.id for p in v] for k, v in routed.items()} == {
        KEY: ["s1", "s9"],
        "quiet": [],  # known, and the platform lists none of its slots
        "gone-fn": ["s11"],  # a function no state knows: its own core retires the slot
        SYSTEM_KEY: ["s10", "s12"],
    }
    gone = decide(FnState(key="gone-fn"), listing(*routed["gone-fn"], key="gone-fn"), T + 5, DEMO)
    assert [(ev.instance_id, ev.reason) for ev in gone.events] == [("gone-fn-2@s11", "unknown to the state")]
    d = decide(FnState(key=SYSTEM_KEY), listing(*routed[SYSTEM_KEY], key=SYSTEM_KEY), T + 5, DEMO)
    assert [(ev.instance_id, ev.reason) for ev in d.events] == [
        ("slot@s10", "unknown to the state"),
        ("a-b@s12", "unknown to the state"),
    ]
    assert all(i.phase is Phase.RETIRING for i in d.state.instances.values())
    assert decide(d.state, listing(*routed[SYSTEM_KEY], key=SYSTEM_KEY), T + 6, DEMO).events == []
    assert d.wake_ms is None


def test_a_request_that_lost_its_idle_instance_gets_a_new_one():
    s, _ = run(assign("r1"), ready("fn-1", "s1"), idle("r1"), at=0)
    s, _ = run(c.Cancel(key=KEY, request_id="x"), s=s, at=10)
    d = decide(s, listing(), T + 5, DEMO)
    assert "fn-1" not in d.state.instances
    s2 = decide(d.state, assign("r2"), T + 6, DEMO).state
    assert [i.id for i in s2.in_phase(Phase.CREATING)] == ["fn-2"]
