"""`python -m scaler.controller`: the single writer of its functions' events, answering commands sent over NATS.

Alone it serves front gateways (`python -m scaler.gateway`) and the workers; `scaler node` runs it with
the gRPC service in one process.
"""

import argparse
from pathlib import Path

import msgspec

from scaler.controller import needs, policies
from scaler.controller.core.limits import NO_LIMITS, Limits, limits_problem
from scaler.controller.core.policy import DEFAULT_POLICY, Policy
from scaler.controller.knobs import KnobError, knob_arg, tuned
from scaler.controller.shell import MAX_BEHIND_S, STORE_WAIT_S, Controller
from scaler.runtime import service
from scaler.runtime.clock import Clock
from scaler.runtime.permissions import Preflight
from scaler.store import config


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        default=service.env("POLICY", DEFAULT_POLICY),
        type=policies.checked,
        metavar="NAME",
        help=f"the scaling policy: {policies.choices()}; the node must be able to import it"
        " (docs/policies.md: A policy from outside the project) [SCALER_POLICY]",
    )
    add_tuning(p)
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
        "--store-wait",
        type=service.positive,
        default=service.env("STORE_WAIT", str(STORE_WAIT_S)),
        help="seconds a call waits for an event store that does not answer (stalled, failing over) before it is"
        " refused with UNAVAILABLE; keep it well below the callers' deadlines [SCALER_STORE_WAIT]",
    )

    config.add_retention(p)  # whoever creates EVENTS sets them; a node brings the stream to its own

    p.add_argument(
        "--limits",
        type=limits_file,
        default=service.env("LIMITS", ""),
        metavar="PATH",
        help="a JSON file of caps, reserved instances, rest and forget (docs/operations.md: Limits) [SCALER_LIMITS]",
    )
    p.add_argument(
        "--session-idle",
        type=service.positive,
        default=service.env("SESSION_IDLE", None),
        metavar="S",
        help="seconds a session may go unused before it loses its instance"
        f" (default {NO_LIMITS.session_idle_ms // 1000}; docs/sessions-and-admin.md) [SCALER_SESSION_IDLE]",
    )


def add_tuning(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exchange-rate",
        type=policies.rate_arg,
        default=service.env("EXCHANGE_RATE", None),
        metavar="GB_S",
        help="learned: slot GB·s one second of a request's waiting is worth (higher: fewer cold starts, more"
        " idle memory); default: the run's own, the challenge's score (docs/policies.md) [SCALER_EXCHANGE_RATE]",
    )
    p.add_argument(
        "--knob",
        action="append",
        type=knob_arg,
        metavar="NAME=VALUE",
        help="a knob of the policy's config, e.g. between_share=0.01 (`scaler sweep --knobs` lists them); again for"
        " more [SCALER_KNOBS: NAME=VALUE ..., when no --knob is given]",
    )
    p.set_defaults(knobs_from_env=service.env("KNOBS", ""))


def knobs_of(a: argparse.Namespace) -> list[tuple[str, str]]:
    """The knobs asked for: the `--knob` flags, else SCALER_KNOBS (space-separated NAME=VALUE)."""
    if a.knob:
        return a.knob
    try:
        return [knob_arg(text) for text in a.knobs_from_env.split()]
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"SCALER_KNOBS: {e}") from None


def replicas(text: str) -> int:
    """An argparse type: a JetStream replica count, 1, 3 or 5, or auto (0: 3 on a cluster, else 1).

    An even count is refused: a write needs a quorum, so 2 copies stop every write when either server
    does (4 when two do), surviving no more than the odd count below them while costing more."""
    if text == "auto":
        return 0
    if text in {"2", "4"}:
        raise argparse.ArgumentTypeError(
            f"{text} copies survive no more server losses than {int(text) - 1} (a write needs a quorum): use 1, 3 or 5"
        )
    if text not in {"1", "3", "5"}:
        raise argparse.ArgumentTypeError(f"JetStream keeps 1, 3 or 5 copies (or auto), got {text}")
    return int(text)


def limits_file(path: str) -> str:
    """The path, once its content is known to be good: a mistake is said at the command line, with the file's name."""
    load_limits(path)
    return path


def load_limits(path: str) -> Limits:
    """The operator's caps from a JSON file; every mistake said with the file's name."""
    if not path:
        return NO_LIMITS
    try:
        limits = msgspec.json.decode(Path(path).read_bytes(), type=Limits)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{path}: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise argparse.ArgumentTypeError(f"{path}: {e}") from None
    if problem := limits_problem(limits) or policies.limits_problem(limits):
        raise argparse.ArgumentTypeError(f"{path}: {problem}")
    return limits


def policy_of(a: argparse.Namespace) -> Policy:
    """The node's policy with the knobs and the exchange rate asked for; refused, said at the command line."""
    try:
        return tuned(policies.get_policy(a.policy), a.exchange_rate, knobs_of(a))
    except KnobError as e:
        raise SystemExit(str(e)) from None


def make(a: argparse.Namespace) -> Controller:
    policy = policy_of(a)
    limits = load_limits(a.limits)
    if a.session_idle is not None:  # the flag over the limits file's session_idle_ms
        limits = msgspec.structs.replace(limits, session_idle_ms=round(a.session_idle * 1000))
    return Controller(
        service.nats_access(a, "node"),
        policy,
        Clock(a.speed),
        replicas=a.replicas,
        nats_monitor=a.nats_monitor,
        nats_unsynced=a.nats_unsynced,
        max_behind_s=a.max_behind,
        store_wait_s=a.store_wait,
        limits=limits,
        retention=config.retention(a),
    )


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m scaler.controller", __doc__)
    add_options(p)
    return p


def checked(a: argparse.Namespace) -> service.Component:
    """The controller, once NATS is known to permit what it does."""
    controller = make(a)
    return service.Together([Preflight(controller.nats_url, "controller", needs.NODE), controller])


def main() -> None:
    service.main(checked, build_parser().parse_args())


if __name__ == "__main__":
    main()
