"""The Grafana dashboard queries only what a node exports: every metric and label its PromQL names is
in a real node's /metrics (scraped from `scaler up`, after a request was served, one ran on a state of a
tenant's function, and an Admin call was made), and the panels the seed systems' rows added have data."""

import json
import re
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from tests.cli.test_up import assign_and_idle, http_get, start_up, stop
from tests.system.test_seeds import admin_at

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "scaler.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def names(expr: str) -> tuple[set[str], set[str]]:
    """The metrics and the labels a PromQL expression names."""
    labels = {m for sel in re.findall(r"\{([^}]*)\}", expr) for m in re.findall(r"(\w+)\s*[=!]~?", sel)}
    labels |= {g.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for g in group.split(",")}
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)', " ", expr)
    if m := re.match(r"\s*label_values\((\w+),\s*(\w+)\)", expr):  # a Grafana variable query
        return {m.group(1)}, {m.group(2)}
    metrics = {
        word
        for word, call in re.findall(r"\b([a-zA-Z_:][\w:]*)\b(\s*\()?", bare)
        if not call and word not in KEYWORDS and not re.fullmatch(r"[\d.e]+", word)
    }
    return metrics, labels - {""}


def test_names_finds_metrics_and_labels_in_promql():
    expr = 'histogram_quantile(0.99, sum by (le, method) (rate(scaler_call_seconds_bucket{x=~"$f"}[$__rate_interval])))'
    assert names(expr) == ({"scaler_call_seconds_bucket"}, {"le", "method", "x"})
    assert names("sum(rate(a_total[5m])) / sum(rate(b_total[5m]))") == ({"a_total", "b_total"}, set())
    assert names("label_values(scaler_arrivals_total, function)") == ({"scaler_arrivals_total"}, {"function"})


def test_the_dashboard_draws_what_the_issue_asks_for():
    dashboard = json.loads(DASHBOARD.read_text())
    metrics = set().union(*(names(q)[0] for q in queries(dashboard)))
    assert {
        "scaler_instances",
        "scaler_requests_waiting",
        "scaler_cold_starts_total",
        "scaler_prewarms_total",
        "scaler_wait_seconds_total",
        "scaler_slot_gb_seconds_total",
        "scaler_call_seconds_bucket",
        "scaler_append_seconds_bucket",
        "scaler_sessions",
        "scaler_states",
        "scaler_tenant_instances",
        "scaler_tenant_quota",
        "scaler_throttled_total",
        "scaler_admin_actions_total",
        "scaler_partitions",
    } <= metrics


async def state_of_a_tenant_and_an_admin_call(address: str) -> None:
    """An Assign on a state of tenant acme's function (and its Idle), one on another state that the tenant's
    quota of one throttles (the first state's instance is its own), and an Admin call that raises the quota."""
    async with grpc.aio.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)
        meta = pb.Meta(key="stateful", runtime="python", memory_in_mb=128)

        async def on(state: str, request_id: str) -> pb.AssignReply:
            named = (("scaler-state", state), ("scaler-tenant", "acme"))
            return await scaler.Assign(
                pb.AssignRequest(request_id=request_id, meta_data=meta), timeout=20, metadata=named
            )

        reply = await on("cart", "s1")
        await scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)), timeout=20)
        assert (await on("other", "s2")).status == pb.Throttle
        await admin_at(channel, "Quota", tenant="acme", max_on_demand=5)


async def test_every_metric_the_dashboard_queries_is_one_a_node_exports(tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text('{"throttle_after_ms": 200, "tenants": {"acme": {"max_on_demand": 1}}}')
    proc, address, lines = await start_up("--metrics-port", "0", "--data-dir", str(tmp_path), "--limits", str(limits))
    try:
        url = re.search(r"metrics (http://\S+/metrics)", lines[-1]).group(1)
        assert await assign_and_idle(address, "r1") == "hello-1"  # per-function metrics exist once it is seen
        await state_of_a_tenant_and_an_admin_call(address)
        status, text = await http_get(url)
    finally:
        code, rest = await stop(proc)
    assert status == 200 and code == 0, rest
    exported: dict[str, set[str]] = {}
    values: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            exported.setdefault(s.name, set()).update(s.labels)
            values[s.name, tuple(sorted(s.labels.items()))] = s.value

    def value(name: str, **labels: str) -> float:
        return next(v for (n, ls), v in values.items() if n == name and labels.items() <= dict(ls).items())

    assert value("scaler_states", function="stateful") == 1 and value("scaler_sessions", function="hello") == 0
    assert value("scaler_tenant_instances", tenant="acme", kind="on_demand") == 1
    assert value("scaler_tenant_quota", tenant="acme", kind="on_demand") == 5
    assert value("scaler_admin_actions_total", action="Quota", outcome="OK") == 1
    assert value("scaler_throttled_total", why="tenant_quota") == 1 and value("scaler_partitions") == 32
    for expr in queries(json.loads(DASHBOARD.read_text())):
        metrics, labels = names(expr)
        assert metrics, expr
        missing = metrics - exported.keys()
        assert not missing, f"{expr}: the node exports no {', '.join(sorted(missing))}"
        known = set().union(*(exported[m] for m in metrics))
        assert labels <= known, f"{expr}: no metric it queries has label(s) {', '.join(sorted(labels - known))}"
