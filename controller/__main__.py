"""`python -m controller`: the single writer of events."""

import argparse

from controller.core.policy import DEFAULT_POLICY, POLICIES, get_policy
from controller.shell import Controller
from runtime import service
from runtime.clock import Clock


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m controller", __doc__)
    p.add_argument(
        "--policy", default=service.env("POLICY", DEFAULT_POLICY), choices=sorted(POLICIES), help="[SCALER_POLICY]"
    )
    p.add_argument(
        "--snapshots",
        default=service.env("SNAPSHOTS", ""),
        help="sqlite file for state snapshots, so a start replays only what follows the newest (none: full replay)"
        " [SCALER_SNAPSHOTS]",
    )
    return p


def main() -> None:
    args = build_parser().parse_args()
    service.main(lambda a: Controller(a.nats, get_policy(a.policy), Clock(a.speed), a.snapshots or None), args)


if __name__ == "__main__":
    main()
