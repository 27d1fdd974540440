"""`python -m controller`: the single writer of its functions' events, answering commands sent over NATS.

Alone it serves front gateways (`python -m gateway`) and the workers; `scaler node` runs it with
the gRPC service in one process.
"""

import argparse

from controller.core.policy import DEFAULT_POLICY, POLICIES, get_policy
from controller.shell import MAX_BEHIND_S, Controller
from runtime import service
from runtime.clock import Clock


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", default=service.env("POLICY", DEFAULT_POLICY), choices=sorted(POLICIES), help="[SCALER_POLICY]"
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=int(service.env("REPLICAS", "1")),
        help="copies JetStream keeps of the stream, leases and snapshots it creates: 3 on a NATS cluster"
        " (an existing stream's are never lowered) [SCALER_REPLICAS]",
    )

    p.add_argument(
        "--max-behind",
        type=float,
        default=float(service.env("MAX_BEHIND", str(MAX_BEHIND_S))),
        help="seconds decisions may lag behind arrivals (a weighted mean) before new Assigns are refused"
        " with RESOURCE_EXHAUSTED [SCALER_MAX_BEHIND]",
    )


def make(a: argparse.Namespace) -> Controller:
    return Controller(a.nats, get_policy(a.policy), Clock(a.speed), replicas=a.replicas, max_behind_s=a.max_behind)


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m controller", __doc__)
    add_options(p)
    return p


def main() -> None:
    service.main(make, build_parser().parse_args())


if __name__ == "__main__":
    main()
