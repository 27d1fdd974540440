"""What each call and each append costs, as Prometheus histograms: one `observe` each on the hot path.

The histograms belong to the process (a node has one gRPC service and one controller) and are
not registered anywhere until an endpoint serves them (`endpoint`), so components that serve no
metrics pay only the observe. Everything else a node exports is read from its state when
scraped (scaler/controller/metrics.py).
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

from scaler.runtime.http import HttpEndpoint, Page

# From a warm call on loopback (~1 ms) to one that waits for a cold start (seconds) or times out.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

CALLS = Histogram(
    "scaler_call_seconds",
    "Time the gRPC service took to answer an Assign or Idle call, errors included",
    ["method"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
ASSIGN = CALLS.labels("assign")
IDLE = CALLS.labels("idle")
APPEND = Histogram(
    "scaler_append_seconds",
    "Time an append of one batch of events to the EVENTS stream took (until JetStream's ack)",
    buckets=LATENCY_BUCKETS,
    registry=None,
)


# Rare events, counted as they happen (a call answered Throttle, an operator's call): no cost on the hot path.
THROTTLED = Counter(
    "scaler_throttled",
    "Assign calls answered Throttle: held back past their wait by a cap, or by their tenant's on-demand quota",
    ["why"],
    registry=None,
)
THROTTLE_WHYS = ("cap", "tenant_quota")
ADMIN = Counter(
    "scaler_admin_actions",
    "Calls of the Admin service (scaler functions, restart, stop, set, quota, drain, ...), by method and gRPC outcome",
    ["action", "outcome"],
    registry=None,
)
for _why in THROTTLE_WHYS:  # every series exists from the start: a rate over it is 0, not missing
    THROTTLED.labels(_why)


def admin_action(action: str, outcome: str) -> None:
    ADMIN.labels(action, outcome).inc()


def endpoint(listen: str, collectors: list[Collector], pages: dict[str, Page] | None = None) -> HttpEndpoint:
    """`/metrics` on `listen`: the call and append histograms, the counters, and `collectors`; and `pages` beside
    it."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in (CALLS, APPEND, THROTTLED, ADMIN, *collectors):
        registry.register(collector)
    served = {"/metrics": lambda: (CONTENT_TYPE_LATEST, generate_latest(registry)), **(pages or {})}
    return HttpEndpoint(listen, served, "metrics")
