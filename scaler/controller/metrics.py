"""A node's state as Prometheus metrics, read from the controller when scraped, never counted per call.

Per function: instances by phase, requests waiting, arrivals, cold starts, pre-warms, failures,
time requests waited, slot and execution GB·s, sessions and states bound; per tenant: the instances
its functions hold here and its quotas; the partitions the node serves; and the stream's sequence
and the age of the last snapshot. The figures are the ones the controller already folds into each function's state, so
the hot path does nothing for them, and they agree with `scaler replay`. Times and GB·s are in
the scaler's clock: trace time under `--speed N`.
"""

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from scaler.controller.core.state import Phase
from scaler.controller.shell import Controller


def _one(name: str, doc: str, label: str, value: str, n: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    family.add_metric([value], n)
    return family


class ControllerCollector:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def _tenants(self) -> Iterator[Metric]:
        """What each tenant's functions hold on this node (summed over nodes: on all), and its quotas."""
        kinds = ["tenant", "kind"]
        held = GaugeMetricFamily("scaler_tenant_instances", "A tenant's instances on this node, by kind", labels=kinds)
        quota = GaugeMetricFamily("scaler_tenant_quota", "A tenant's quota over every node, by kind", labels=kinds)
        quotas = self.controller.ledger.tenants()
        for tenant, h in sorted(self.controller.ledger.totals.tenants.items()):
            held.add_metric([tenant, "on_demand"], h.on_demand)
            held.add_metric([tenant, "reserved"], h.reserved)
        for tenant, q in sorted(quotas.items()):
            quota.add_metric([tenant, "on_demand"], q.max_on_demand)
            quota.add_metric([tenant, "reserved"], q.max_reserved)
        yield from (held, quota)

    def collect(self) -> Iterator[Metric]:
        c = self.controller
        now = c.clock.now_ms()
        fn = ["function"]
        instances = GaugeMetricFamily(
            "scaler_instances", "Instances of a function, by phase", labels=["function", "phase"]
        )
        waiting = GaugeMetricFamily(
            "scaler_requests_waiting", "Requests of a function waiting for an instance", labels=fn
        )
        arrivals = CounterMetricFamily("scaler_arrivals", "Requests (Assign calls) of a function", labels=fn)
        cold = CounterMetricFamily("scaler_cold_starts", "Instances started for a request that waited", labels=fn)
        prewarms = CounterMetricFamily("scaler_prewarms", "Instances started with no request waiting", labels=fn)
        failures = CounterMetricFamily("scaler_failures", "Requests answered with an error", labels=fn)
        waited = CounterMetricFamily("scaler_wait_seconds", "Time requests waited for an instance", labels=fn)
        slot = CounterMetricFamily("scaler_slot_gb_seconds", "Memory x life of the function's slots", labels=fn)
        run = CounterMetricFamily("scaler_execution_gb_seconds", "Memory x time instances ran requests", labels=fn)
        sessions = GaugeMetricFamily("scaler_sessions", "Sessions bound to an instance of a function", labels=fn)
        states = GaugeMetricFamily("scaler_states", "States a function's instances hold (stateful routes)", labels=fn)
        for key, s in c.ledger.states.items():
            by_phase = dict.fromkeys(Phase, 0)
            for instance in s.instances.values():
                by_phase[instance.phase] += 1
            for phase, n in by_phase.items():
                instances.add_metric([key, phase.value], n)
            st = c.ledger.features_of(key)
            waiting.add_metric([key], len(s.queue))
            arrivals.add_metric([key], st.arrivals)
            cold.add_metric([key], st.cold_starts)
            prewarms.add_metric([key], st.prewarms)
            failures.add_metric([key], st.failures)
            waited.add_metric([key], st.wait_ms / 1000)
            slot.add_metric([key], s.slot_gb_ms_at(now) / 1000)
            run.add_metric([key], st.exec_gb_ms / 1000)
            sessions.add_metric([key], len(s.sessions))
            states.add_metric([key], len(s.states))
        yield from (instances, waiting, arrivals, cold, prewarms, failures, waited, slot, run, sessions, states)
        yield from self._tenants()
        yield _one(
            "scaler_partitions",
            "Partitions the node serves (sum over nodes: all of them)",
            "node",
            c.node,
            len(c.serving),
        )
        yield GaugeMetricFamily("scaler_functions", "Functions the controller knows", value=len(c.ledger.states))
        yield GaugeMetricFamily(
            "scaler_stream_sequence", "Newest EVENTS stream sequence the controller folded or appended", c.ledger.seq
        )
        yield CounterMetricFamily(
            "scaler_events_lost",
            "Times EVENTS was found to hold less than this node had folded, not by retention (its partitions reloaded)",
            value=c.losses,
        )
        yield CounterMetricFamily(
            "scaler_unreconciled_loads",
            "Partition loads (start, take-over, reload) not reconciled with the platform: it lists no slots",
            value=c.unreconciled,
        )
        yield GaugeMetricFamily(
            "scaler_partitions_refused",
            "Partitions this node holds but refuses: no snapshot covers what retention dropped (their calls fail)",
            value=len(c.partitions.refused) if c.partitions is not None else 0,
        )
        yield GaugeMetricFamily(
            "scaler_nats_sync_always",
            "Whether NATS syncs every write to disk before acknowledging it: 1 yes, 0 no, -1 unknown",
            c.sync.gauge,
        )
        offset = c.partitions.clock_offset_ms if c.partitions is not None else None
        if offset is not None:
            yield GaugeMetricFamily(
                "scaler_clock_offset_seconds",
                "This node's clock less the NATS server's, as its last partition load read it (more than 1 s: a skew)",
                offset / 1000,
            )
        saved = getattr(c, "snapshot_saved_s", None)
        if saved is not None:
            yield GaugeMetricFamily(
                "scaler_snapshot_age_seconds", "Seconds since the controller last wrote a snapshot", time.time() - saved
            )
