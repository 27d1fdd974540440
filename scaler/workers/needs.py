"""What the workers must be permitted on NATS, checked at their start as a node's are (scaler/runtime/permissions.py).

The operator's side of it is deploy/nats.conf's WORKER (docs/operations.md, "NATS permissions"): a worker reads
EVENTS through its kind's durable consumer and reports on `report.<partition>`; it sends no command, writes no
event, lease or snapshot, and hears no other role's answers. Deleting its consumer (to make it again, should
EVENTS be deleted under it) is not tried here: trying it would do it (scaler/runtime/permissions.py).
"""

from scaler.proto.subjects import EVENTS, RECONCILE_ASK, REPORT
from scaler.runtime.access import inbox
from scaler.runtime.permissions import PROBE, Need, publish, subscribe
from scaler.workers.effects import EffectWorker
from scaler.workers.gc import GcWorker

_API = "$JS.API"


def of(kinds: list[type[EffectWorker]]) -> list[Need]:
    """The needs of a process running workers of these kinds."""
    out = [
        publish(f"{_API}.STREAM.INFO.{EVENTS}", f"find {EVENTS}"),
        publish(f"{_API}.STREAM.CREATE.{EVENTS}", f"create {EVENTS} should it be the first"),
        publish(f"{_API}.STREAM.MSG.GET.{EVENTS}", "read what a function's events say of an effect done again"),
        publish(f"{_API}.CONSUMER.CREATE.{EVENTS}", "read a function's events"),
        publish(f"{REPORT}.{PROBE}", "report what the platform did"),
        subscribe(f"{inbox('worker')}.{PROBE}", "hear its answers and its batches"),
    ]
    for kind in kinds:
        durable = kind.durable
        out += [
            publish(f"{_API}.CONSUMER.DURABLE.CREATE.{EVENTS}.{durable}", f"join its consumer {durable}"),
            publish(f"{_API}.CONSUMER.INFO.{EVENTS}.{durable}", f"watch its consumer {durable}"),
            publish(f"$JS.ACK.{EVENTS}.{durable}.{PROBE}", f"ack the batches of {durable}"),
        ]
    if GcWorker in kinds:
        out.append(subscribe(RECONCILE_ASK, "hear the nodes ask for a reconcile"))
    return out
