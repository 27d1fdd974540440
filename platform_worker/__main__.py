"""`python -m platform_worker`: starts instances on the platform as the controller asks."""

import argparse

from platform_worker.worker import PlatformWorker
from scaler import runtime


def build_parser() -> argparse.ArgumentParser:
    p = runtime.parser("python -m platform_worker", __doc__, uses_clock=False)
    p.add_argument("--platform", default=runtime.env("PLATFORM", "127.0.0.1:50051"), help="[SCALER_PLATFORM]")
    p.add_argument(
        "--concurrency",
        type=int,
        default=int(runtime.env("CONCURRENCY", "1024")),
        help="platform calls in flight at most [SCALER_CONCURRENCY]",
    )
    return p


def main() -> None:
    args = build_parser().parse_args()
    runtime.main(lambda a: PlatformWorker(a.nats, a.platform, a.concurrency), args)


if __name__ == "__main__":
    main()
