"""An operator's commands on one instance, a state, or the function's settings while it runs.

Restart and Delete of a whole function are in decide.py; here: restart or stop one instance
(Pulsar's restartFunctionInstance and stop), delete a state (openYuanRong's GetAndDeleteState),
set a function's limits, policy and version while it runs (openYuanRong's HandleInstanceConfigEvent
and HandleFunctionUpdateEvent), and create a deleted function again. Each is stored as events and
answered once stored. `d` is the decision being built (decide._Draft): its state, clock and room,
and what it emits and answers.
"""

from typing import Any

from msgspec.structs import replace

from scaler.controller.core.policy import policy_form_problem
from scaler.controller.core.policy.learned import rate_problem
from scaler.controller.core.state import FnState, Instance, Override, Phase
from scaler.proto.commands import Code, Configure, Create, DeleteState, Restart, Stop
from scaler.proto.events import (
    FunctionCreated,
    InstanceRetired,
    InstanceToRetire,
    LimitsSet,
    PolicySet,
    StateDeleted,
    VersionSet,
)

MAX_VERSION_BYTES = 64


def retire(d: Any, inst: Instance, why: str) -> bool:
    """Retire one instance: now, unless a request runs on it (then once released). Whether it went now."""
    if inst.phase is Phase.BUSY:
        d.emit(InstanceToRetire(at_ms=d.now, instance_id=inst.id, reason=why))
        return False
    d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
    return True


def _instance(d: Any, cmd: Restart | Stop) -> Instance | None:
    inst = d.s.instances.get(cmd.instance_id)
    if inst is None or inst.phase is Phase.RETIRING or inst.retire_on_release:
        d.reply(cmd.reply_to, "", Code.NOT_FOUND, message=f"no live instance {cmd.instance_id!r} of {cmd.key!r}")
        return None
    return inst


def _said(inst: Instance, now: bool) -> str:
    return f"{inst.id} retired" if now else f"{inst.id} retires when released"


def restart_instance(d: Any, cmd: Restart) -> None:
    """One instance retires (once released, if busy), and another starts in its place at once (caps allowing)."""
    inst = _instance(d, cmd)
    if inst is None:
        return
    now = retire(d, inst, f"restarted: {cmd.reason}" if cmd.reason else "restarted")
    if d.may_start(1):
        fresh = d.s.next_instance_id()
        d.start(why=f"in place of {inst.id}, restarted by an operator")
        d.reply(cmd.reply_to, "", message=f"{_said(inst, now)}; {fresh} starts in its place")
    else:
        d.reply(cmd.reply_to, "", message=f"{_said(inst, now)}; none starts in its place (at a cap or quota)")


def stop(d: Any, cmd: Stop) -> None:
    """One instance retires (once released, if busy); none starts in its place."""
    inst = _instance(d, cmd)
    if inst is not None:
        now = retire(d, inst, f"stopped: {cmd.reason}" if cmd.reason else "stopped")
        d.reply(cmd.reply_to, "", message=_said(inst, now))


def delete_state(d: Any, cmd: DeleteState) -> None:
    """The state's route goes, and the instance that held it retires (once released, if busy)."""
    route = d.s.states.get(cmd.state)
    if route is None:
        d.reply(cmd.reply_to, "", Code.NOT_FOUND, message=f"no state {cmd.state!r} of {cmd.key!r}")
        return
    d.emit(StateDeleted(at_ms=d.now, state=cmd.state, reason=cmd.reason))
    inst = d.s.instances.get(route.instance_id)
    if inst is None or inst.phase is Phase.RETIRING:
        d.reply(cmd.reply_to, "", message=f"state {cmd.state} deleted (its instance {route.instance_id} was gone)")
        return
    now = retire(d, inst, f"its state {cmd.state} deleted")
    d.reply(cmd.reply_to, "", message=f"state {cmd.state} deleted; {_said(inst, now)}")


def create(d: Any, cmd: Create) -> None:
    """A deleted function serves calls again (its tombstone goes), at the version given if any."""
    if d.s.deleted is None:
        d.reply(cmd.reply_to, "", Code.FAILED_PRECONDITION, message=f"function {cmd.key!r} is not deleted")
        return
    if problem := version_problem(cmd.version):
        d.reply(cmd.reply_to, "", Code.INVALID_ARGUMENT, message=problem)
        return
    d.emit(FunctionCreated(at_ms=d.now, version=cmd.version, reason=cmd.reason))
    at = f" at version {d.s.version}" if d.s.version else ""
    d.reply(cmd.reply_to, "", message=f"created again{at}: its calls are served")


def configure(d: Any, cmd: Configure) -> None:
    """Limits, policy and version set while the function runs, each an event; what they retire goes now."""
    if d.s.deleted is not None:
        message = f"function {cmd.key!r} is deleted: create it again first"
        d.reply(cmd.reply_to, "", Code.FAILED_PRECONDITION, message=message)
        return
    if problem := _configure_problem(cmd):
        d.reply(cmd.reply_to, "", Code.INVALID_ARGUMENT, message=problem)
        return
    said = []
    limits = _limits(d.s, cmd)
    most = d.room.file.max_instances if limits.max_instances is None else limits.max_instances
    least = d.room.file.min_warm if limits.min_warm is None else limits.min_warm
    if most and least > most:
        d.reply(cmd.reply_to, "", Code.INVALID_ARGUMENT, message=f"min_warm {least} is more than max_instances {most}")
        return
    if limits != (d.s.limits or Override()):
        d.emit(LimitsSet(at_ms=d.now, **Override.given(limits), reason=cmd.reason))
        d.room = d.room.over(d.s)
        said.append(_limits_said(d.room.limits))
        if retired := retire_past_max(d):
            said.append(f"{retired} idle instance(s) past them retired")
    if cmd.policy is not None and cmd.policy != d.s.policy:
        d.emit(PolicySet(at_ms=d.now, policy=cmd.policy, reason=cmd.reason))
        said.append(f"policy {cmd.policy}" if cmd.policy else "the node's policy")
    if cmd.version is not None and cmd.version != d.s.version:
        d.emit(VersionSet(at_ms=d.now, version=cmd.version, reason=cmd.reason))
        retired = retire_misfits(d)
        said.append(f"version {cmd.version or '(none)'}" + (f", {retired} idle instance(s) retired" if retired else ""))
    d.reply(cmd.reply_to, "", message="; ".join(said) or "nothing changed")


def _configure_problem(cmd: Configure) -> str | None:
    for name in ("max_instances", "max_memory_mb", "min_warm"):
        if (value := getattr(cmd, name)) is not None and value < 0:
            return f"{name} must be 0 or more, got {value}"
    if cmd.exchange_rate is not None and (problem := rate_problem(cmd.exchange_rate)):
        return problem
    if cmd.policy and (problem := policy_form_problem(cmd.policy)):
        return problem
    return version_problem(cmd.version or "")


def version_problem(version: str) -> str | None:
    if len(version.encode()) > MAX_VERSION_BYTES:
        return f"a version is at most {MAX_VERSION_BYTES} bytes"
    return None


def _limits(s: FnState, cmd: Configure) -> Override:
    """The function's limits over the file's once the command is applied (None fields: as the file says)."""
    base = Override() if cmd.reset_limits else (s.limits or Override())
    given = {k: v for k, v in Override.given(cmd).items() if v is not None}
    return replace(base, **given)


def _limits_said(lim: Any) -> str:
    named = [f"{k} {v:g}" for k, v in Override.given(lim).items() if v]
    return "limits " + (", ".join(named) if named else "none")


def retire_past_max(d: Any) -> int:
    """A lowered max: idle instances past the function's max_instances or max_memory_mb retire, those holding no
    state first, the longest idle first. Busy ones past it retire as they become idle. How many retired."""
    lim = d.room.limits
    if not lim.max_instances and not lim.max_memory_mb:
        return 0
    live = [i for i in d.s.instances.values() if i.phase is not Phase.RETIRING]
    over = len(live) - lim.max_instances if lim.max_instances else 0
    over_mb = sum(i.memory_mb for i in live) - lim.max_memory_mb if lim.max_memory_mb else 0
    retired = 0
    for inst in sorted(d.s.in_phase(Phase.IDLE), key=lambda i: (bool(d.s.holder(i.id)), i.since_ms, i.id)):
        if over <= 0 and over_mb <= 0:
            break
        named = f"max_instances {lim.max_instances}" if over > 0 else f"max_memory_mb {lim.max_memory_mb}"
        d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=f"past {named}"))
        over, over_mb, retired = over - 1, over_mb - inst.memory_mb, retired + 1
    return retired


def retire_misfits(d: Any) -> int:
    """Idle instances that may no longer run the function's requests (another version, runtime, or less memory
    than it asks for) retire; busy ones do as they become idle, never mid-request. How many retired."""
    retired = 0
    for inst in d.s.in_phase(Phase.IDLE) if d.s.meta is not None or d.s.version else ():
        if why := misfit(d.s, inst):
            d.emit(InstanceRetired(at_ms=d.now, instance_id=inst.id, slot_id=inst.slot_id, reason=why))
            retired += 1
    return retired


def misfit(s: FnState, inst: Instance) -> str:
    """Why the instance may not run the function's requests now ("" when it may): it has less memory than the
    function asks for, or another runtime, or another version."""
    m = s.meta
    if m is not None and inst.memory_mb < m.memory_mb:
        return f"{inst.memory_mb} MB, less than the function's {m.memory_mb} MB now"
    if m is not None and inst.runtime != m.runtime and inst.runtime:  # "": not known (a slot found, say)
        return f"runtime {inst.runtime or '(none)'}, the function's is {m.runtime or '(none)'} now"
    if inst.version != s.version:
        return f"version {inst.version or '(none)'}, the function is at {s.version or '(none)'} now"
    return ""
