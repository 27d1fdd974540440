"""Caps, reserved instances and memory: what an operator allows, whatever the policy would like.

Per function (with defaults for those not named): at most `max_instances` instances and
`max_memory_mb` of their memory, and at least `min_warm` kept ready once the function is known (a
production pool's reserved instances). Over all functions a node holds: at most `max_instances`
and `max_memory_mb`, split between nodes by the share of partitions each holds, so that together
they never pass them. Past a cap the core starts nothing: a request waits for an instance to free
up, and one still waiting `throttle_after_ms` after it arrived is answered Throttle. A function
with nothing in flight and no instance rests after `rest_after_ms` (its record of recent releases
goes) and is forgotten after `forget_after_ms` (its whole state goes): memory holds only the
functions of the last day, each small.
"""

from typing import Annotated

import msgspec

from scaler.controller.core.state import FnState, Phase, Totals

Count = Annotated[int, msgspec.Meta(ge=0)]  # a cap or a reserve: 0 or more (a cap of 0: none)
Wait = Annotated[int, msgspec.Meta(gt=0)]  # a time in ms: more than 0


class FunctionLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_instances: Count = 0  # 0: no cap
    max_memory_mb: Count = 0
    min_warm: Count = 0

    def __post_init__(self) -> None:
        if self.max_instances and self.min_warm > self.max_instances:
            raise ValueError(f"min_warm {self.min_warm} is more than max_instances {self.max_instances}")


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    default: FunctionLimits = FunctionLimits()
    functions: dict[str, FunctionLimits] = {}
    max_instances: Count = 0  # over all functions (0: no cap)
    max_memory_mb: Count = 0
    throttle_after_ms: Wait = 10_000  # how long a request waits at a cap before it is answered Throttle
    rest_after_ms: Wait = 10 * 60_000  # idle this long (nothing in flight, no instance): a function rests
    forget_after_ms: Wait = 24 * 3_600_000  # idle this long: it is forgotten, what was learned of it too
    session_idle_ms: Wait = 60_000  # a session unused this long loses its instance (openYuanRong's reaper: 60 s)

    def of(self, key: str) -> FunctionLimits:
        return self.functions.get(key, self.default)

    def share(self, fraction: float) -> "Limits":
        """The caps over all functions for a node holding `fraction` of the partitions (rounded down)."""
        if not self.max_instances and not self.max_memory_mb:
            return self
        return msgspec.structs.replace(
            self,
            max_instances=int(self.max_instances * fraction) if self.max_instances else 0,
            max_memory_mb=int(self.max_memory_mb * fraction) if self.max_memory_mb else 0,
        )


NO_LIMITS = Limits()


class Room(msgspec.Struct, frozen=True, kw_only=True):
    """What one function may still start, and how long its requests wait at a cap: a decision's input."""

    limits: FunctionLimits = FunctionLimits()
    instances_left: int | None = None  # under the caps over all functions; None: no cap
    memory_left_mb: int | None = None
    throttle_after_ms: int = NO_LIMITS.throttle_after_ms
    rest_after_ms: int = NO_LIMITS.rest_after_ms
    forget_after_ms: int = NO_LIMITS.forget_after_ms
    session_idle_ms: int = NO_LIMITS.session_idle_ms

    @staticmethod
    def of(limits: Limits, key: str, totals: Totals) -> "Room":
        """The room left for `key` given the instances all functions hold (`totals`, this node's)."""
        return Room(
            limits=limits.of(key),
            instances_left=limits.max_instances - totals.instances if limits.max_instances else None,
            memory_left_mb=limits.max_memory_mb - totals.memory_mb if limits.max_memory_mb else None,
            throttle_after_ms=limits.throttle_after_ms,
            rest_after_ms=limits.rest_after_ms,
            forget_after_ms=limits.forget_after_ms,
            session_idle_ms=limits.session_idle_ms,
        )

    def starts(self, s: FnState, started: int) -> int | None:
        """How many more instances of `s` may start, `started` having started in this decision; None: no cap."""
        if s.meta is None:
            return 0
        mem = s.meta.memory_mb
        held = len(s.instances)  # retiring ones hold their slot until it is destroyed
        held_mb = sum(i.memory_mb for i in s.instances.values())
        caps = [
            self.limits.max_instances - held if self.limits.max_instances else None,
            (self.limits.max_memory_mb - held_mb) // mem if self.limits.max_memory_mb else None,
            self.instances_left - started if self.instances_left is not None else None,
            (self.memory_left_mb - started * mem) // mem if self.memory_left_mb is not None else None,
        ]
        bound = [c for c in caps if c is not None]
        return max(0, min(bound)) if bound else None

    def reserved(self, s: FnState) -> int:
        """Instances to keep ready (idle or busy) beyond what the policy wants."""
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        return max(0, self.limits.min_warm - live)


NO_ROOM = Room()
