"""`python -m gateway`: the gRPC Scaler service in front of the event stream."""

import argparse

from gateway.server import Gateway
from runtime import service


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m gateway", __doc__, uses_clock=False)
    p.add_argument("--listen", default=service.env("LISTEN", "0.0.0.0:9001"), help="gRPC address [SCALER_LISTEN]")
    p.add_argument(
        "--reply-timeout",
        type=float,
        default=float(service.env("REPLY_TIMEOUT", "60")),
        help="seconds to wait for the controller's answer [SCALER_REPLY_TIMEOUT]",
    )
    return p


def main() -> None:
    args = build_parser().parse_args()
    service.main(lambda a: Gateway(a.nats, a.listen, a.reply_timeout), args)


if __name__ == "__main__":
    main()
