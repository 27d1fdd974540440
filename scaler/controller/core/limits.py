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

Per tenant (a function's tenant: the limits file's `tenant`, else the one its Assigns name): at most
`max_on_demand` instances started on demand and `max_reserved` kept as reserved ones, over all the
tenant's functions on every node (the nodes' counts are shared as the run's totals are). Past the
on-demand quota a request waits as at a cap, and is answered Throttle marked
ReachMaxOnDemandInstancesPerTenant; past the reserved quota reserved instances are not started.

An operator may set a function's limits while it runs (an event, FnState.limits: over the file's),
and the tenants' quotas (scaler/controller/tenants.py: over the file's `tenants`).
"""

import re
from typing import Annotated

import msgspec

from scaler.controller.core.policy import policy_form_problem
from scaler.controller.core.policy.learned import rate_problem
from scaler.controller.core.state import NOTHING_HELD, FnState, Held, Phase, held
from scaler.controller.core.totals import Totals

Count = Annotated[int, msgspec.Meta(ge=0)]  # a cap or a reserve: 0 or more (a cap of 0: none)
Wait = Annotated[int, msgspec.Meta(gt=0)]  # a time in ms: more than 0


class FunctionLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_instances: Count = 0  # 0: no cap
    max_memory_mb: Count = 0
    min_warm: Count = 0
    tenant: str = ""  # whose quotas its instances count against (over what its Assigns name)
    policy: str = ""  # the policy that decides it ("": the node's --policy)
    exchange_rate: float | None = None  # slot GB·s a second of its waiting is worth (learned's; None: the node's)

    def __post_init__(self) -> None:
        if self.max_instances and self.min_warm > self.max_instances:
            raise ValueError(f"min_warm {self.min_warm} is more than max_instances {self.max_instances}")

    def over(self, s: FnState) -> "FunctionLimits":
        """These limits with what an operator set for the function while it runs (FnState.limits) over them; a
        max set below the file's min_warm (or a min_warm above its max) holds both to the max."""
        o = s.limits
        if o is None:
            return self
        most = self.max_instances if o.max_instances is None else o.max_instances
        least = self.min_warm if o.min_warm is None else o.min_warm
        return msgspec.structs.replace(
            self,
            max_instances=most,
            max_memory_mb=self.max_memory_mb if o.max_memory_mb is None else o.max_memory_mb,
            min_warm=min(least, most) if most else least,
            exchange_rate=self.exchange_rate if o.exchange_rate is None else o.exchange_rate,
        )


MAX_TENANT_BYTES = 64
_TENANT = re.compile(r"[A-Za-z0-9_-]+")


def tenant_problem(tenant: str) -> str | None:
    """Why `tenant` is not an acceptable tenant name (a key of the quotas' bucket), or None when it is."""
    if len(tenant.encode()) > MAX_TENANT_BYTES:
        return f"a tenant is at most {MAX_TENANT_BYTES} bytes"
    if not _TENANT.fullmatch(tenant):
        return f"a tenant is letters, digits, '-' and '_', got {tenant!r}"
    return None


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What all of a tenant's functions may hold at once, over every node (openYuanRong's tenant quota)."""

    max_on_demand: Count = 0  # instances started on demand (0: no quota)
    max_reserved: Count = 0  # instances kept as reserved ones (min_warm)


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    default: FunctionLimits = FunctionLimits()
    functions: dict[str, FunctionLimits] = {}
    max_instances: Count = 0  # over all functions (0: no cap)
    max_memory_mb: Count = 0
    throttle_after_ms: Wait = 10_000  # how long a request waits at a cap before it is answered Throttle
    rest_after_ms: Wait = 10 * 60_000  # idle this long (nothing in flight, no instance): a function rests
    forget_after_ms: Wait = 24 * 3_600_000  # idle this long: it is forgotten, what was learned of it too
    session_idle_ms: Wait = 60_000  # a session unused this long loses its instance (openYuanRong's reaper: 60 s)
    tenants: dict[str, TenantQuota] = {}  # quotas by tenant

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


def limits_problem(limits: Limits) -> str | None:
    """What is wrong in a limits file's tenants and policies (unknown to msgspec's schema), or None."""
    named = [("default", limits.default), *((f"functions.{k}", f) for k, f in limits.functions.items())]
    for where, f in named:
        if f.tenant and (problem := tenant_problem(f.tenant)):
            return f"{where}.tenant: {problem}"
        if f.policy and (problem := policy_form_problem(f.policy)):
            return f"{where}.policy: {problem}"
        if f.exchange_rate is not None and (problem := rate_problem(f.exchange_rate)):
            return f"{where}.exchange_rate: {problem}"
    for tenant in limits.tenants:
        if problem := tenant_problem(tenant):
            return f"tenants: {problem}"
    return None


class Room(msgspec.Struct, frozen=True, kw_only=True):
    """What one function may still start, and how long its requests wait at a cap: a decision's input."""

    limits: FunctionLimits = FunctionLimits()  # the function's: the file's, with what an operator set over them
    file: FunctionLimits = FunctionLimits()  # ... as the limits file says
    instances_left: int | None = None  # under the caps over all functions; None: no cap
    memory_left_mb: int | None = None
    throttle_after_ms: int = NO_LIMITS.throttle_after_ms
    rest_after_ms: int = NO_LIMITS.rest_after_ms
    forget_after_ms: int = NO_LIMITS.forget_after_ms
    session_idle_ms: int = NO_LIMITS.session_idle_ms
    tenant: str = ""  # the function's tenant: the limits file's, else the one its call names, else its state's
    quota: TenantQuota | None = None  # that tenant's quota
    tenant_others: Held = NOTHING_HELD  # ... and what the tenant's other functions hold, on every node
    # The platform failed a start of some function lately, and none has succeeded since (the node's word for it): a
    # function's idle instances are kept until then, since none of them could be replaced meanwhile.
    starts_failing_until_ms: int = 0

    @staticmethod
    def of(limits: Limits, s: FnState, totals: Totals, tenants: Totals | None = None, named: str = "") -> "Room":
        """The room left for `s` given the instances all functions hold (`totals`, this node's), with what an
        operator set for it over the file's limits. `tenants`: whose counts its tenant's quota is held to (the
        run's, over every node; by default `totals`); `named`: the tenant its call names."""
        own = limits.of(s.key)
        tenant = own.tenant or named or s.tenant
        quota = limits.tenants.get(tenant) if tenant and limits.tenants else None
        others = NOTHING_HELD
        if quota is not None:
            others = (tenants or totals).held(tenant)
            if tenant == s.tenant:  # its own instances are counted as the decision changes them (`tenant_held`)
                others = others.plus(held(s), -1)
        return Room(
            limits=own.over(s),
            file=own,
            instances_left=limits.max_instances - totals.instances if limits.max_instances else None,
            memory_left_mb=limits.max_memory_mb - totals.memory_mb if limits.max_memory_mb else None,
            throttle_after_ms=limits.throttle_after_ms,
            rest_after_ms=limits.rest_after_ms,
            forget_after_ms=limits.forget_after_ms,
            session_idle_ms=limits.session_idle_ms,
            tenant=tenant,
            quota=quota,
            tenant_others=others,
        )

    def over(self, s: FnState) -> "Room":
        """This room once an operator changed the function's limits (`s` holds the change)."""
        return msgspec.structs.replace(self, limits=self.file.over(s))

    def tenant_held(self, s: FnState) -> Held:
        """What the function's tenant holds on every node, the function being `s` (as a decision left it)."""
        return self.tenant_others.plus(held(s))

    def tenant_left(self, s: FnState, reserved: bool) -> int | None:
        """How many more instances of this kind the function's tenant may hold, the function being `s` (its starts
        so far in a decision, and its instances gone, counted); None: no quota."""
        q = self.quota
        if q is None or not (q.max_reserved if reserved else q.max_on_demand):
            return None
        h = self.tenant_held(s)
        return q.max_reserved - h.reserved if reserved else q.max_on_demand - h.on_demand

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
