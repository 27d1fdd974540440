"""A failing platform seen over all of a node's functions (scaler.controller.platform_health): failed starts of
two other functions keep a function's idle instances, and a start that succeeds again lets them retire; one
function whose starts keep failing keeps nothing of the others."""

from scaler.controller.core.policy import get_policy
from scaler.controller.ledger import Ledger
from scaler.controller.platform_health import FAILING_HOLD_MS
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import META

POLICY = get_policy("demo")


def decided(ledger: Ledger, cmd: c.Command, at: int) -> list[e.Event]:
    d = ledger.decide(cmd, at, POLICY)
    ledger.commit(cmd, d, ledger.seq + 1 if d.events else None)
    return d.events


def planned(ledger: Ledger, key: str, at: int) -> list[e.Event]:
    d = ledger.plan(key, at, POLICY)
    ledger.commit_plan(key, d, ledger.seq + 1 if d.events else None)
    return d.events


def warm(ledger: Ledger, key: str, at: int) -> int:
    """`key` with one idle instance: returns when its keep-alive ends."""
    decided(ledger, c.Assign(key=key, request_id=f"{key}-r", meta=META, reply_to="to"), at)
    (inst,) = ledger.state(key).instances.values()
    decided(ledger, c.SlotReady(key=key, instance_id=inst.id, slot_id=f"{key}-s", create_ms=100, init_ms=50), at + 10)
    decided(ledger, c.Idle(key=key, request_id=f"{key}-r", instance_id=inst.id, reply_to="to"), at + 20)
    planned(ledger, key, at + 20)  # its keep-alive
    return ledger.state(key).instances[inst.id].keep_until_ms


def failed_start(ledger: Ledger, key: str, at: int) -> None:
    decided(ledger, c.Assign(key=key, request_id=f"{key}-r", meta=META, reply_to="to"), at)
    (inst,) = ledger.state(key).instances.values()
    decided(ledger, c.SlotFailed(key=key, instance_id=inst.id, reason="Init: InternalError"), at + 10)


def test_other_functions_failed_starts_keep_a_warm_functions_idle_instance_until_a_start_succeeds_again():
    ledger = Ledger()
    keep = warm(ledger, "warm", 0)
    failed_start(ledger, "broken", keep - 2_000)
    failed_start(ledger, "other", keep - 1_000)
    kept = planned(ledger, "warm", keep)
    assert [type(x) for x in kept] == [e.KeptAlive], kept
    assert kept[0].until_ms == keep - 1_000 + 10 + FAILING_HOLD_MS
    assert "platform fails starts" in kept[0].why
    # a start of any function succeeds: the platform works again, the instance retires when it is next due
    warm(ledger, "third", kept[0].until_ms - 100)
    retired = planned(ledger, "warm", kept[0].until_ms)
    assert [type(x) for x in retired] == [e.InstanceRetired], retired


def test_one_functions_failed_starts_keep_nothing_of_the_others():
    ledger = Ledger()
    keep = warm(ledger, "warm", 0)
    failed_start(ledger, "broken", keep - 1_000)
    assert [type(x) for x in planned(ledger, "warm", keep)] == [e.InstanceRetired]


def test_failed_starts_long_ago_keep_nothing():
    ledger = Ledger()
    keep = warm(ledger, "warm", 0)
    failed_start(ledger, "broken", keep - FAILING_HOLD_MS - 1_000)
    failed_start(ledger, "other", keep - FAILING_HOLD_MS - 500)
    assert [type(x) for x in planned(ledger, "warm", keep)] == [e.InstanceRetired]
