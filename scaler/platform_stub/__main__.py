"""`python -m scaler.platform_stub`: a stand-in for the platform's Platform service."""

import argparse

from scaler.platform_stub.server import MODES, PlatformStub
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
        "--mode",
        choices=sorted(MODES),
        default=service.env("PLATFORM_MODE", "kind"),
        help="what the platform does that keeps a slot of a vanished CreateSlot from leaking: kind (dedupes request"
        " ids and lists its slots), challenge (as the challenge's platform: a new slot per CreateSlot, a second"
        " Init fails, no list; a CreateSlot whose caller went away torn down), dedupe or list (that one"
        " alone), bare (none: such a slot leaks) [SCALER_PLATFORM_MODE]",
    )
    p.add_argument(
        "--like-challenge",
        action="store_const",
        const="challenge",
        dest="mode",
        help="the same as --mode challenge",
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
            a.listen, metas, a.create_latency_ms, Clock(a.speed), mode=MODES[a.mode], tls=service.server_tls(a)
        ),
        args,
    )


if __name__ == "__main__":
    main()
