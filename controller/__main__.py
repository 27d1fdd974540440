"""`python -m controller`: the single writer of its functions' events, answering commands sent over NATS.

Alone it serves front gateways (`python -m gateway`) and the workers; `scaler node` runs it with
the gRPC service in one process.
"""

import argparse
from pathlib import Path

import msgspec

from controller.core.limits import NO_LIMITS, Limits
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

    p.add_argument(
        "--limits",
        type=load_limits,
        default=service.env("LIMITS", ""),
        metavar="PATH",
        help="a JSON file of caps and reserved instances (README: Limits) [SCALER_LIMITS]",
    )


def load_limits(path: str) -> Limits:
    """The operator's caps from a JSON file; every mistake said with the file's name."""
    if not path:
        return NO_LIMITS
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=Limits)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{path}: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise argparse.ArgumentTypeError(f"{path}: {e}") from None


def make(a: argparse.Namespace) -> Controller:
    policy = get_policy(a.policy)
    return Controller(a.nats, policy, Clock(a.speed), replicas=a.replicas, max_behind_s=a.max_behind, limits=a.limits)


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m controller", __doc__)
    add_options(p)
    return p


def main() -> None:
    service.main(make, build_parser().parse_args())


if __name__ == "__main__":
    main()
