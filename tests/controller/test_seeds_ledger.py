"""The seed systems' rows decided through the ledger as a node decides (pure: no NATS, no clock): tenants'
quotas, stateful routes, limits set while running, versions and tombstones, a policy per function, one
instance restarted or stopped. Each decision is checked to equal its replayed events."""

import msgspec

from scaler.controller.core.limits import NO_LIMITS, FunctionLimits, Limits, TenantQuota
from scaler.controller.core.policy import get_policy
from scaler.controller.core.state import Override, Phase, replay
from scaler.controller.ledger import Ledger
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import DEMO, META

THROTTLE_MS = 1_000


class Node:
    """A ledger driven as a node drives it: each command's response, then the function's plan."""

    def __init__(self, limits: Limits = NO_LIMITS) -> None:
        self.ledger = Ledger()
        self.ledger.limits = limits
        self.seq = 0
        self.events: list[e.Event] = []

    def __call__(self, cmd: c.AnyCommand, at: int) -> c.Reply | None:
        before = self.ledger.state(cmd.key)
        d = self.ledger.decide(cmd, at, DEMO)
        self.ledger.commit(cmd, d, self._seq(d.events))
        planned = self.ledger.plan(cmd.key, at, DEMO)
        self.ledger.commit_plan(cmd.key, planned, self._seq(planned.events))
        assert replay(before, d.events + planned.events) == planned.state
        self.events += d.events + planned.events
        return next((r for r in d.replies if r.to == getattr(cmd, "reply_to", None)), None)

    def _seq(self, events: list) -> int | None:
        if not events:
            return None
        self.seq += 1
        return self.seq

    def of(self, kind) -> list:
        return [x for x in self.events if isinstance(x, kind)]

    def s(self, key: str = "fn"):
        return self.ledger.state(key)


def assign(r: str, key: str = "fn", meta: e.Meta = META, **named) -> c.Assign:
    return c.Assign(key=key, request_id=r, meta=meta, reply_to=f"to-{r}", **named)


def idle(r: str, i: str, key: str = "fn", **kw) -> c.Idle:
    return c.Idle(key=key, request_id=r, instance_id=i, reply_to=f"idle-{r}", **kw)


def ready(i: str, key: str = "fn") -> c.SlotReady:
    return c.SlotReady(key=key, instance_id=i, slot_id=f"slot-{i}")


def served(node: Node, r: str, at: int, key: str = "fn", **named) -> str:
    """Assign `r`; when an instance starts for it, make it ready: the instance it got."""
    reply = node(assign(r, key, **named), at)
    if reply is None:
        started = next(x for x in node.of(e.SlotWanted) if x.for_request == r)
        node(ready(started.instance_id, key), at + 1)
        return node.s(key).instances[started.instance_id].id
    assert reply.code is c.Code.OK, reply
    return reply.instance_id


def operator(node: Node, cmd, at: int) -> c.Reply:
    return node(msgspec.structs.replace(cmd, reply_to="op"), at)


# --- tenants and their quotas ---------------------------------------------------------------


def test_a_tenants_on_demand_quota_holds_over_its_functions_and_is_answered_with_its_own_status():
    acme = FunctionLimits(tenant="acme")
    quota = {"acme": TenantQuota(max_on_demand=2)}
    node = Node(Limits(functions={"f1": acme, "f2": acme}, tenants=quota, throttle_after_ms=THROTTLE_MS))
    served(node, "a", 0, "f1")
    served(node, "b", 10, "f2")  # the tenant's second instance, of another function
    assert node(assign("c", "f1"), 20) is None  # a third would pass the quota: it waits
    waiting = node.of(e.RequestWaiting)[-1]
    assert "tenant acme's max_on_demand 2" in waiting.why
    assert node.ledger.totals.held("acme").on_demand == 2
    node(c.Tick(key="f1", due_ms=20 + THROTTLE_MS), 20 + THROTTLE_MS)
    refused = node.of(e.RequestFailed)[-1]
    assert refused.request_id == "c" and refused.message.startswith("ReachMaxOnDemandInstancesPerTenant: tenant acme")
    assert "max_on_demand 2" in refused.message
    assert [x.tenant for x in node.of(e.TenantSet)] == ["acme", "acme"]


def test_the_quota_code_goes_to_the_caller_and_a_freed_instance_serves_before_it():
    node = Node(Limits(tenants={"acme": TenantQuota(max_on_demand=1)}, throttle_after_ms=THROTTLE_MS))
    first = served(node, "a", 0, tenant="acme")  # named by the caller: no limits file entry
    assert node(assign("b", tenant="acme"), 10) is None
    reply = node(idle("a", first), 20)  # freed within the wait: b takes it
    assert reply.code is c.Code.OK
    assert node.s().instances[first].request_id == "b"
    node(assign("x", tenant="acme"), 30)
    node(c.Tick(key="fn", due_ms=30 + THROTTLE_MS), 30 + THROTTLE_MS)
    d = node.ledger.decide(assign("y", tenant="acme"), 40 + 2 * THROTTLE_MS, DEMO)
    tick = node.ledger.decide(c.Tick(key="fn", due_ms=0), 50 + 3 * THROTTLE_MS, DEMO, after=d)
    assert [r.code for r in tick.replies] == [c.Code.QUOTA]


def test_the_limits_files_tenant_wins_over_the_callers_and_other_nodes_count():
    limits = Limits(functions={"f1": FunctionLimits(tenant="acme")}, tenants={"acme": TenantQuota(max_on_demand=2)})
    a, b = Node(limits), Node(limits)
    served(a, "a", 0, "f1", tenant="other")
    assert a.s("f1").tenant == "acme"
    served(b, "b", 0, "f2", tenant="acme")  # another node's function of the tenant
    a.ledger.others = b.ledger.totals  # as the nodes share their totals (scaler/controller/shared.py)
    assert a(assign("c", "f1"), 10) is None and "tenant acme's" in a.of(e.RequestWaiting)[-1].why
    b.ledger.quotas = {"acme": TenantQuota(max_on_demand=3)}  # raised while running, on the other node alone
    b.ledger.others = a.ledger.totals
    assert served(b, "d", 20, "f2", tenant="acme")


def test_a_request_held_at_the_quota_starts_in_the_decision_that_frees_the_tenants_slot():
    node = Node(Limits(tenants={"acme": TenantQuota(max_on_demand=1)}, throttle_after_ms=THROTTLE_MS))
    first = served(node, "a", 0, tenant="acme")
    node(idle("a", first, need_destroy=True), 10)  # retiring: its slot counts until destroyed
    assert node(assign("b", tenant="acme"), 20) is None
    node(c.SlotDestroyed(key="fn", instance_id=first, slot_id=f"slot-{first}"), 30)
    assert [(x.for_request, x.at_ms) for x in node.of(e.SlotWanted)] == [("a", 0), ("b", 30)]


def test_a_tenants_reserved_quota_caps_the_reserved_instances():
    keeps = FunctionLimits(tenant="acme", min_warm=3)
    node = Node(Limits(functions={"fn": keeps}, tenants={"acme": TenantQuota(max_reserved=1)}))
    served(node, "a", 0)
    assert [x.reserved for x in node.of(e.SlotWanted)] == [False, True]  # one reserved, not two
    assert node.ledger.totals.held("acme") == node.ledger.totals.held("acme").__class__(1, 1)


# --- stateful routes -----------------------------------------------------------------------


def test_a_state_keeps_its_instance_waits_for_it_and_moves_only_when_it_goes():
    node = Node()
    holder = served(node, "s1", 0, state="cart")
    assert [(x.state, x.instance_id) for x in node.of(e.StateBound)] == [("cart", holder)]
    assert node(assign("s2", state="cart"), 10) is None  # its instance is busy: it waits, nothing starts
    assert len(node.of(e.SlotWanted)) == 1 and "holds its state" in node.of(e.RequestWaiting)[-1].why
    node(idle("s1", holder), 20)
    assert node.s().instances[holder].request_id == "s2"
    node(idle("s2", holder), 30)
    other = served(node, "plain", 40)  # a request without the state never takes the state's instance
    assert other != holder
    node(idle("plain", other), 50)
    far = 50 + 3_600_000  # long past any keep-alive: the state's instance stays, the other one went
    node(c.Tick(key="fn", due_ms=far), far)
    assert node.s().instances[holder].phase is Phase.IDLE and node.s().instances[other].phase is Phase.RETIRING
    assert served(node, "s3", far + 10, state="cart") == holder
    node(idle("s3", holder, need_destroy=True), far + 20)  # the instance dies: the state moves at its next request
    moved = served(node, "s4", far + 30, state="cart")
    assert moved != holder and node.s().states["cart"].instance_id == moved
    assert "went" in node.of(e.StateBound)[-1].why


def test_deleting_a_state_retires_its_instance():
    node = Node()
    holder = served(node, "s1", 0, state="cart")
    said = operator(node, c.DeleteState(key="fn", state="cart", reason="checked out"), 10)
    assert said.code is c.Code.OK and f"{holder} retires when released" in said.message
    node(idle("s1", holder), 20)
    assert node.s().instances[holder].phase is Phase.RETIRING and node.s().states == {}
    assert operator(node, c.DeleteState(key="fn", state="cart"), 30).code is c.Code.NOT_FOUND


# --- limits set while running --------------------------------------------------------------


def test_a_lowered_max_retires_idle_instances_past_it_and_starts_none_beyond():
    node = Node(Limits(throttle_after_ms=THROTTLE_MS))
    got = [served(node, r, n) for n, r in enumerate("abc")]
    for n, (r, i) in enumerate(zip("ab", got, strict=False)):
        node(idle(r, i), 10 + n)  # two idle, c busy
    said = operator(node, c.Configure(key="fn", max_instances=1, reason="budget"), 20)
    assert said.message == "limits max_instances 1; 2 idle instance(s) past them retired"
    assert node.s().limits == Override(max_instances=1)
    assert [x.max_instances for x in node.of(e.LimitsSet)] == [1]
    assert node(assign("d"), 30) is None and "max_instances 1" in node.of(e.RequestWaiting)[-1].why
    node(idle("c", got[2]), 40)  # the busy one serves d: within the max
    assert node.s().instances[got[2]].request_id == "d"
    said = operator(node, c.Configure(key="fn", reset_limits=True, min_warm=2), 50)
    assert node.s().limits == Override(min_warm=2) and said.message == "limits min_warm 2"
    assert sum(1 for x in node.of(e.SlotWanted) if x.reserved) == 1  # a reserved one besides d's


# --- versions and tombstones ---------------------------------------------------------------


def test_a_new_version_retires_the_old_instances_as_they_become_idle_never_mid_request():
    node = Node()
    old_idle, old_busy = served(node, "a", 0, version="v1"), served(node, "b", 1, version="v1")
    node(idle("a", old_idle), 10)
    fresh = served(node, "c", 20, version="v2")  # v2: the idle v1 instance retires, c starts a v2 one
    assert fresh not in (old_idle, old_busy) and node.s().instances[old_idle].phase is Phase.RETIRING
    assert node.s().instances[old_busy].phase is Phase.BUSY  # mid-request: left alone
    node(idle("b", old_busy), 30)
    assert node.s().instances[old_busy].phase is Phase.RETIRING
    assert node.s().instances[fresh].version == "v2"
    runtime = msgspec.structs.replace(META, runtime="python3.12")
    node(idle("c", fresh), 40)
    assert served(node, "d", 50, meta=runtime) != fresh  # another runtime: the old instance is not reused


def test_a_deleted_function_is_refused_until_created_again_or_called_at_another_version():
    node = Node()
    served(node, "a", 0, version="v1")
    operator(node, c.Delete(key="fn", reason="app removed"), 10)
    refused = node(assign("b", version="v1"), 20)
    assert refused.code is c.Code.NOT_FOUND and "was deleted: app removed" in refused.message
    assert operator(node, c.Restart(key="fn"), 25).code is c.Code.NOT_FOUND
    served(node, "c", 30, version="v2")  # a new version creates it again
    assert node.of(e.FunctionCreated)[-1].version == "v2"
    operator(node, c.Delete(key="fn"), 40)
    far = 40 + 48 * 3_600_000  # the tombstone outlives forgetting
    node(c.Tick(key="fn", due_ms=far), far)
    assert node(assign("d"), far + 1).code is c.Code.NOT_FOUND
    assert operator(node, c.Create(key="fn", reason="back"), far + 2).code is c.Code.OK
    served(node, "e", far + 3)
    assert operator(node, c.Create(key="fn"), far + 4).code is c.Code.FAILED_PRECONDITION


# --- a policy per function -----------------------------------------------------------------


def test_a_function_keeps_the_policy_the_limits_file_or_an_operator_chose_for_it():
    node = Node(Limits(functions={"fn": FunctionLimits(policy="fixed10")}))
    i = served(node, "a", 0)
    node(idle("a", i), 10)
    assert node.of(e.KeptAlive)[-1].why == "fixed keep-alive 600s"  # not the node's demo
    said = operator(node, c.Configure(key="fn", policy="demo", reason="cheaper"), 20)
    assert said.message == "policy demo" and node.s().policy == "demo"
    served(node, "b", 30)
    node(idle("b", i), 40)
    assert node.of(e.KeptAlive)[-1].why == "fixed keep-alive 300s"
    assert operator(node, c.Configure(key="fn", policy="nope"), 50).code is c.Code.INVALID_ARGUMENT


def test_an_exchange_rate_set_live_decides_the_function_at_it_over_the_files_until_reset():
    learned = get_policy("learned")
    node = Node(Limits(functions={"fn": FunctionLimits(exchange_rate=5.0)}))
    served(node, "a", 0)
    assert node.ledger.policy_of(node.s(), learned).config.exchange_rate == 5.0  # the limits file's
    said = operator(node, c.Configure(key="fn", exchange_rate=1000.0, reason="latency first"), 10)
    assert (said.code, said.message) == (c.Code.OK, "limits exchange_rate 1000")
    assert node.of(e.LimitsSet)[-1].exchange_rate == 1000.0 and node.s().limits == Override(exchange_rate=1000.0)
    assert node.ledger.policy_of(node.s(), learned).config.exchange_rate == 1000.0
    assert node.ledger.policy_of(node.s(), DEMO) is DEMO  # a policy without a rate decides as it did
    refused = operator(node, c.Configure(key="fn", exchange_rate=5e6), 20)
    assert refused.code is c.Code.INVALID_ARGUMENT and "0.1 to 1,000,000" in refused.message
    assert len(node.of(e.LimitsSet)) == 1  # nothing stored for it
    operator(node, c.Configure(key="fn", reset_limits=True), 30)
    assert node.s().limits is None and node.ledger.policy_of(node.s(), learned).config.exchange_rate == 5.0


# --- one instance ---------------------------------------------------------------------------


def test_one_instance_restarted_or_stopped():
    node = Node()
    a, b = served(node, "a", 0), served(node, "b", 1)
    node(idle("a", a), 10)
    said = operator(node, c.Restart(key="fn", instance_id=a, reason="leak"), 20)
    assert said.message == f"{a} retired; fn-3 starts in its place"
    assert node.s().instances["fn-3"].phase is Phase.CREATING
    said = operator(node, c.Stop(key="fn", instance_id=b), 30)
    assert said.message == f"{b} retires when released" and node.s().instances[b].phase is Phase.BUSY
    node(idle("b", b), 40)
    assert node.s().instances[b].phase is Phase.RETIRING and len(node.of(e.SlotWanted)) == 3
    assert operator(node, c.Stop(key="fn", instance_id=b), 50).code is c.Code.NOT_FOUND
    counted = node.s().instances[b]
    assert (counted.served, counted.errors, counted.busy_ms) == (1, 0, 38)
