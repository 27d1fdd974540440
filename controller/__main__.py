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
from runtime.bus import DEFAULT_RETENTION, Retention
from runtime.clock import Clock

# The least retention a node accepts: the controller looks at the stream every second and snapshots a
# partition once its snapshot falls into the older half of what is kept (or a quarter of the age), so
# half the store must outlast a second of the busiest appends (about 1,000 batches/s of ~1.5 kB).
MIN_RETENTION_HOURS = 1 / 60
MIN_STORE_LIMIT_GB = 0.004


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        default=service.env("POLICY", DEFAULT_POLICY),
        choices=sorted(POLICIES),
        help=f"the scaling policy (default {DEFAULT_POLICY}) [SCALER_POLICY]",
    )
    p.add_argument(
        "--replicas",
        type=replicas,
        default=service.env("REPLICAS", "auto"),  # a string: argparse checks it with `type` too
        help="copies JetStream keeps of the stream, leases and snapshots it creates (an existing stream's are"
        " never lowered); default auto: 3 on a NATS cluster, 1 on a lone server [SCALER_REPLICAS]",
    )
    p.add_argument(
        "--nats-monitor",
        default=service.env("NATS_MONITOR", ""),
        metavar="URL",
        help="NATS's monitoring endpoint(s), comma-separated, asked at start whether every write is synced"
        " to disk; default: each NATS host on port 8222 [SCALER_NATS_MONITOR]",
    )
    p.add_argument(
        "--nats-unsynced",
        action="store_true",
        default=service.env("NATS_UNSYNCED", "") not in ("", "0", "false"),
        help="NATS is meant not to sync every write (an acknowledged decision may be lost in a power loss):"
        " no warning about it [SCALER_NATS_UNSYNCED]",
    )

    p.add_argument(
        "--max-behind",
        type=service.positive,
        default=service.env("MAX_BEHIND", str(MAX_BEHIND_S)),
        help="seconds decisions may lag behind arrivals (a weighted mean) before new Assigns are refused"
        " with RESOURCE_EXHAUSTED [SCALER_MAX_BEHIND]",
    )

    p.add_argument(
        "--retention-hours",
        type=service.at_least(MIN_RETENTION_HOURS),
        default=service.env("RETENTION_HOURS", str(DEFAULT_RETENTION.max_age_s / 3600)),
        metavar="H",
        help="EVENTS keeps batches this long (README: Retention); a node sets it on the stream once every"
        " partition has a snapshot [SCALER_RETENTION_HOURS]",
    )
    p.add_argument(
        "--store-limit-gb",
        type=service.at_least(MIN_STORE_LIMIT_GB),
        default=service.env("STORE_LIMIT_GB", str(DEFAULT_RETENTION.max_bytes / 10**9)),
        metavar="GB",
        help="... and at most this much of them, the oldest going first [SCALER_STORE_LIMIT_GB]",
    )

    p.add_argument(
        "--limits",
        type=limits_file,
        default=service.env("LIMITS", ""),
        metavar="PATH",
        help="a JSON file of caps, reserved instances, rest and forget (README: Limits) [SCALER_LIMITS]",
    )


def replicas(text: str) -> int:
    """An argparse type: a JetStream replica count, 1 to 5, or auto (0: 3 on a cluster, else 1)."""
    if text == "auto":
        return 0
    if text not in {"1", "2", "3", "4", "5"}:
        raise argparse.ArgumentTypeError(f"JetStream keeps 1 to 5 copies (or auto), got {text}")
    return int(text)


def limits_file(path: str) -> str:
    """The path, once its content is known to be good: a mistake is said at the command line, with the file's name."""
    load_limits(path)
    return path


def retention(a: argparse.Namespace) -> Retention:
    return Retention(max_age_s=a.retention_hours * 3600, max_bytes=int(a.store_limit_gb * 10**9))


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
    limits = load_limits(a.limits)
    return Controller(
        a.nats,
        policy,
        Clock(a.speed),
        replicas=a.replicas,
        nats_monitor=a.nats_monitor,
        nats_unsynced=a.nats_unsynced,
        max_behind_s=a.max_behind,
        limits=limits,
        retention=retention(a),
    )


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m controller", __doc__)
    add_options(p)
    return p


def main() -> None:
    service.main(make, build_parser().parse_args())


if __name__ == "__main__":
    main()
