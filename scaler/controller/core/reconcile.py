"""Reconcile: a function's state against the platform's own list of live slots.

Run when the gc worker starts (a crash may have left slots nobody tracks, or lost the report of
a slot's end). Both outcomes are events with a reason, so the log explains them. Anything that
may legitimately be in flight is left alone: a slot younger than the grace period (CreateSlot
returned but SlotReady is not in yet), a slot whose instance this function is still creating,
and an instance started so recently that the list may predate its slot.
"""

from collections.abc import Iterable

from scaler.controller.core.state import FnState, Phase
from scaler.proto.commands import PlatformSlot, Reconcile, owner
from scaler.proto.events import Event, InstanceDestroyed, InstanceRetired
from scaler.proto.subjects import SYSTEM_KEY

UNKNOWN = "unknown to the state"


def by_function(slots: Iterable[PlatformSlot], known: Iterable[str]) -> dict[str, tuple[PlatformSlot, ...]]:
    """Who answers for each listed slot: the function its instance names (known or not), else the system key.

    Every known function is in the result, with no slots when the platform lists none of its: then
    whatever slots it holds are gone.
    """
    out: dict[str, list[PlatformSlot]] = {key: [] for key in known}
    for slot in slots:
        out.setdefault(owner(slot) or SYSTEM_KEY, []).append(slot)
    return {key: tuple(found) for key, found in out.items()}


def events(s: FnState, cmd: Reconcile, now: int) -> list[Event]:
    listed = {p.id for p in cmd.slots}
    # The listing was taken on the gc worker's clock, the instances' times on this node's: a listing is never
    # later than its arrival here, so one that looks later (this node's clock behind the worker's) counts from now.
    listed_here = min(cmd.listed_ms, now)
    out: list[Event] = []
    for inst in s.instances.values():
        if inst.slot_id and inst.slot_id not in listed and inst.wanted_ms + cmd.grace_ms <= listed_here:
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
