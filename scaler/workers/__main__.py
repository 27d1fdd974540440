"""`python -m scaler.workers [platform|gc]`: the effect executors, both in one process unless one is named.

`platform` starts instances (CreateSlot, Init) for SlotWanted; `gc` destroys the slots of
retired instances and reconciles with the platform's list on start.
"""

import argparse

from scaler.runtime import service
from scaler.runtime.clock import Clock
from scaler.runtime.permissions import Preflight
from scaler.runtime.ports import peer
from scaler.store import config
from scaler.workers import needs
from scaler.workers.effects import ACK_WAIT_S, EffectWorker
from scaler.workers.gc import RECONCILE_EVERY_S, RECONCILE_GRACE_S, GcWorker
from scaler.workers.platform import PlatformWorker

KINDS = ("platform", "gc")


def _kind(text: str) -> str:
    if text not in KINDS:  # (argparse's `choices` refuses an empty `nargs="*"` on Python 3.11)
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(KINDS)})")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m scaler.workers", __doc__)
    p.add_argument("kinds", nargs="*", type=_kind, metavar="{platform,gc}", help="which workers (default: both)")
    p.add_argument(
        "--platform", type=peer, default=service.env("PLATFORM", "127.0.0.1:50051"), help="HOST:PORT [SCALER_PLATFORM]"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=int(service.env("CONCURRENCY", "1024")),
        help="platform calls in flight at most, per worker [SCALER_CONCURRENCY]",
    )
    p.add_argument(
        "--ack-wait",
        type=float,
        default=float(service.env("ACK_WAIT", str(ACK_WAIT_S))),
        help="seconds after which an event a dead worker was performing is redelivered [SCALER_ACK_WAIT]",
    )
    service.add_client_tls(p, "platform", "PLATFORM", "the platform")
    p.add_argument(
        "--reconcile-every",
        type=service.positive,
        default=service.env("RECONCILE_EVERY", str(RECONCILE_EVERY_S)),
        metavar="S",
        help="seconds between the gc worker's reconciles with a platform that lists its slots [SCALER_RECONCILE_EVERY]",
    )
    p.add_argument(
        "--reconcile-grace",
        type=service.at_least(0),
        default=service.env("RECONCILE_GRACE", str(RECONCILE_GRACE_S)),
        metavar="S",
        help="a slot younger than this is left alone by a reconcile: it may be one being created right now (keep it"
        " above the platform's longest CreateSlot) [SCALER_RECONCILE_GRACE]",
    )
    config.add_retention(p)
    return p


def make(a: argparse.Namespace) -> service.Component:
    kinds = a.kinds or KINDS
    nats = service.nats_access(a, "worker")
    parts: list[EffectWorker] = []
    if "platform" in kinds:
        parts.append(PlatformWorker(nats, a.platform, a.concurrency, a.ack_wait))
    if "gc" in kinds:
        reconcile = {"reconcile_grace_s": a.reconcile_grace, "reconcile_every_s": a.reconcile_every}
        parts.append(GcWorker(nats, a.platform, Clock(a.speed), a.concurrency, ack_wait_s=a.ack_wait, **reconcile))
    for part in parts:  # should a worker be the first to need EVENTS, it creates it with these limits
        part.retention = config.retention(a)
        part.platform_tls = service.client_tls(a, "platform")
    preflight = Preflight(nats, parts[0].name if len(parts) == 1 else "workers", needs.of([type(p) for p in parts]))
    return Workers(preflight, parts)


class Workers(service.Alongside):
    """The workers of one process, once NATS permits what they do; stopped all at once, each in its own grace."""

    def __init__(self, preflight: Preflight, parts: list[EffectWorker]) -> None:
        super().__init__(parts)
        self.preflight = preflight

    async def start(self) -> str:
        checked = await self.preflight.start()
        return f"{checked}; {await super().start()}"


def main() -> None:
    args = build_parser().parse_args()
    service.main(make, args)


if __name__ == "__main__":
    main()
