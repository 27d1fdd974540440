"""The Grafana dashboard queries only what a node exports: every metric and label its PromQL names is
in a real node's /metrics (scraped from `scaler up`, after a request was served)."""

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.test_up import assign_and_idle, http_get, start_up, stop

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "scaler.json"
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
    } <= metrics


async def test_every_metric_the_dashboard_queries_is_one_a_node_exports(tmp_path):
    proc, address, lines = await start_up("--metrics-port", "0", "--data-dir", str(tmp_path))
    try:
        url = re.search(r"metrics (http://\S+/metrics)", lines[-1]).group(1)
        assert await assign_and_idle(address, "r1") == "hello-1"  # per-function metrics exist once it is seen
        status, text = await http_get(url)
    finally:
        code, rest = await stop(proc)
    assert status == 200 and code == 0, rest
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            exported.setdefault(s.name, set()).update(s.labels)
    for expr in queries(json.loads(DASHBOARD.read_text())):
        metrics, labels = names(expr)
        assert metrics, expr
        missing = metrics - exported.keys()
        assert not missing, f"{expr}: the node exports no {', '.join(sorted(missing))}"
        known = set().union(*(exported[m] for m in metrics))
        assert labels <= known, f"{expr}: no metric it queries has label(s) {', '.join(sorted(labels - known))}"
