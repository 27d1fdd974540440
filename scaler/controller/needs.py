"""What a node must be permitted on NATS, checked at its start (scaler/runtime/permissions.py).

The operator's side of it, a NATS configuration granting exactly this, is in docs/operations.md ("NATS
permissions"); tests/system/test_security.py runs a node under that configuration.
"""

from scaler.controller import shared, snapshots, state_service, tenants
from scaler.controller.leases import LEASES, NODES
from scaler.proto.subjects import CMD, EVENTS, EVT, REPORT, RETURNED
from scaler.runtime.access import inbox
from scaler.runtime.permissions import PROBE, Need, publish, subscribe

_API = "$JS.API.STREAM"


def _bucket(name: str, why: str) -> list[Need]:
    return [publish(f"{_API}.CREATE.KV_{name}", why), publish(f"$KV.{name}.{PROBE}", why, stored=True)]


NODE: list[Need] = [
    publish(f"{_API}.INFO.{EVENTS}", f"read {EVENTS}"),
    publish(f"{_API}.CREATE.{EVENTS}", f"create {EVENTS}"),
    publish(f"{_API}.UPDATE.{EVENTS}", f"set {EVENTS}'s retention"),
    publish(f"$JS.API.CONSUMER.CREATE.{EVENTS}", f"read {EVENTS}"),
    publish(f"{EVT}.n.0.{PROBE}", f"append decisions to {EVENTS}", stored=True),
    *_bucket(LEASES, "hold partition leases"),
    publish(f"{_API}.INFO.KV_{LEASES}", "renew its leases in one batch"),
    publish(f"{_API}.UPDATE.KV_{LEASES}", "renew its leases in one batch"),
    *_bucket(NODES, "say it is alive"),
    publish(f"{_API}.INFO.KV_{NODES}", "count the live nodes"),
    *_bucket(tenants.BUCKET, "hold the tenants' quotas"),
    publish(shared.TOTALS, "tell the other nodes the run's totals"),
    publish(shared.HELD, "tell the other nodes what its tenants hold"),
    publish(tenants.CHANGED, "tell the other nodes a tenant's quota changed"),
    publish(f"{_API}.CREATE.OBJ_{snapshots.BUCKET}", "keep snapshots"),
    publish(f"$O.{snapshots.BUCKET}.M.{PROBE}", "keep snapshots", stored=True),
    publish(f"{CMD}.{PROBE}", "pass calls on to the node that owns their function"),
    publish(f"_INBOX.{PROBE}", "answer commands"),
    subscribe(f"{CMD}.0", "take its partitions' commands"),
    subscribe(f"{REPORT}.0", "take its partitions' reports from the workers"),
    subscribe(f"{inbox('node')}.{PROBE}", "hear answers"),
    subscribe(state_service.SUBJECT, "say its state (`scaler functions`, `scaler replay --verify`)"),
    subscribe(RETURNED, "hear of functions back from a lull on other nodes"),
    subscribe(shared.TOTALS, "hear the run's totals on other nodes"),
    subscribe(shared.HELD, "hear what the tenants hold on other nodes"),
    subscribe(tenants.CHANGED, "hear of quotas set on other nodes"),
]
