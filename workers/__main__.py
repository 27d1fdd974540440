"""`python -m workers [platform|gc]`: the effect executors, both in one process unless one is named.

`platform` starts instances (CreateSlot, Init) for SlotWanted; `gc` destroys the slots of
retired instances and reconciles with the platform's list on start.
"""

import argparse

from runtime import service
from runtime.clock import Clock
from workers.gc import GcWorker
from workers.platform import PlatformWorker

KINDS = ("platform", "gc")


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m workers", __doc__)
    p.add_argument("kinds", nargs="*", choices=KINDS, metavar="{platform,gc}", help="which workers (default: both)")
    p.add_argument("--platform", default=service.env("PLATFORM", "127.0.0.1:50051"), help="[SCALER_PLATFORM]")
    p.add_argument(
        "--concurrency",
        type=int,
        default=int(service.env("CONCURRENCY", "1024")),
        help="platform calls in flight at most, per worker [SCALER_CONCURRENCY]",
    )
    return p


def make(a: argparse.Namespace) -> service.Component:
    kinds = a.kinds or KINDS
    parts: list[service.Component] = []
    if "platform" in kinds:
        parts.append(PlatformWorker(a.nats, a.platform, a.concurrency))
    if "gc" in kinds:
        parts.append(GcWorker(a.nats, a.platform, Clock(a.speed), a.concurrency))
    return parts[0] if len(parts) == 1 else service.Together(parts)


def main() -> None:
    args = build_parser().parse_args()
    service.main(make, args)


if __name__ == "__main__":
    main()
