"""`python -m gc_worker`: keeps keep-alive deadlines and destroys retired instances' slots."""

import argparse

from gc_worker.worker import GcWorker
from scaler import runtime
from scaler.clock import Clock


def build_parser() -> argparse.ArgumentParser:
    p = runtime.parser("python -m gc_worker", __doc__)
    p.add_argument("--platform", default=runtime.env("PLATFORM", "127.0.0.1:50051"), help="[SCALER_PLATFORM]")
    return p


def main() -> None:
    args = build_parser().parse_args()
    runtime.main(lambda a: GcWorker(a.nats, a.platform, Clock(a.speed)), args)


if __name__ == "__main__":
    main()
