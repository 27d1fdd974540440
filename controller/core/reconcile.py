"""Reconcile: a function's state against the platform's own list of live slots.

Run when the gc worker starts (a crash may have left slots nobody tracks, or lost the report of
a slot's end). Both outcomes are events with a reason, so the log explains them. Anything that
may legitimately be in flight is left alone: a slot younger than the grace period (CreateSlot
returned but SlotReady is not in yet), a slot whose instance this function is still creating,
and an instance started so recently that the list may predate its slot.
"""

from collections.abc import Iterable

from controller.core.state import FnState, Phase
from proto.commands import PlatformSlot, Reconcile
from proto.events import Event, InstanceDestroyed, InstanceRetired
from proto.subjects import SYSTEM_KEY

UNKNOWN = "unknown to the state"


def owner(slot: PlatformSlot) -> str:
    """The function whose instance a slot runs, from the instance id (`<key>-<n>`); "" when unknown."""
    key, dash, n = slot.instance_id.rpartition("-")
    return key if dash and n.isdigit() else ""


def unclaimed(states: Iterable[FnState], slots: Iterable[PlatformSlot]) -> tuple[PlatformSlot, ...]:
    """Slots no function can answer for: none of them knows the slot, and its instance names none of them."""
    states = list(states)
    keys = {s.key for s in states}
    known = {i.slot_id for s in states for i in s.instances.values() if i.slot_id}
    return tuple(p for p in slots if p.id not in known and owner(p) not in keys)


def events(s: FnState, cmd: Reconcile, now: int) -> list[Event]:
    listed = {p.id for p in cmd.slots}
    out: list[Event] = []
    for inst in s.instances.values():
        if inst.slot_id and inst.slot_id not in listed and inst.wanted_ms + cmd.grace_ms <= cmd.listed_ms:
            why = f"slot gone: the platform no longer lists {inst.slot_id}"
            out.append(InstanceDestroyed(at_ms=now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
    known = {i.slot_id for i in s.instances.values() if i.slot_id}
    creating = {i.id for i in s.in_phase(Phase.CREATING)}
    for p in cmd.slots:
        mine = s.key == SYSTEM_KEY or owner(p) == s.key
        young = p.created_ms + cmd.grace_ms > cmd.listed_ms
        if mine and not young and p.id not in known and p.instance_id not in creating:
            instance = f"{p.instance_id or 'slot'}@{p.id}"
            out.append(InstanceRetired(at_ms=now, instance_id=instance, slot_id=p.id, reason=UNKNOWN))
    return out
