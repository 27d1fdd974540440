"""`python -m scaler.platform_stub`: a stand-in for the platform's Platform service."""

import argparse

from scaler.platform_stub.server import PlatformStub
from scaler.runtime import service
from scaler.runtime.clock import Clock
from scaler.runtime.ports import address
from scaler.simulator.dataset import DatasetError, load_metas


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m scaler.platform_stub", __doc__, uses_nats=False)
    p.add_argument(
        "--listen",
        type=address,
        default=service.env("PLATFORM_LISTEN", "127.0.0.1:50051"),
        help="gRPC address (0.0.0.0:50051: every interface) [SCALER_PLATFORM_LISTEN]",
    )
    p.add_argument("--metas", default=service.env("METAS", ""), help="metas file or dataset folder [SCALER_METAS]")
    p.add_argument(
        "--create-latency-ms",
        type=int,
        default=int(service.env("CREATE_LATENCY_MS", "100")),
        help="CreateSlot latency [SCALER_CREATE_LATENCY_MS]",
    )
    p.add_argument(
        "--like-challenge",
        action="store_true",
        default=service.env("PLATFORM_LIKE_CHALLENGE", "") not in ("", "0"),
        help="behave as the challenge's platform: a new slot on every CreateSlot, a second Init on a slot fails,"
        " no ListSlots [SCALER_PLATFORM_LIKE_CHALLENGE]",
    )
    service.add_server_tls(p, "the Platform service")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    try:
        metas = load_metas(args.metas) if args.metas else {}
    except DatasetError as e:
        p.error(str(e))
    service.main(
        lambda a: PlatformStub(
            a.listen,
            metas,
            a.create_latency_ms,
            Clock(a.speed),
            like_challenge=a.like_challenge,
            tls=service.server_tls(a),
        ),
        args,
    )


if __name__ == "__main__":
    main()
