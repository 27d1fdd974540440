"""`python -m scaler.gateway`: a front gateway, serving the gRPC Scaler service and forwarding each call over NATS
to the node that owns its function (`scaler node` serves it in the same process as the controller)."""

import argparse

from scaler.gateway.server import Gateway
from scaler.runtime import service
from scaler.runtime.forward import Forwarder
from scaler.runtime.ports import address


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        type=address,
        default=service.env("LISTEN", "0.0.0.0:9001"),
        help="gRPC address (127.0.0.1:PORT: this machine only) [SCALER_LISTEN]",
    )
    p.add_argument(
        "--reply-timeout",
        type=float,
        default=float(service.env("REPLY_TIMEOUT", "60")),
        help="seconds a call waits for its answer [SCALER_REPLY_TIMEOUT]",
    )
    service.add_server_tls(p, "the gRPC service")


class FrontGateway(service.Together):
    """The forwarder, then the gateway; a certificate the gateway cannot use is said before NATS is looked for."""

    def __init__(self, forwarder: Forwarder, gateway: Gateway) -> None:
        super().__init__([forwarder, gateway])
        self.gateway = gateway

    async def start(self) -> str:
        self.gateway.check()
        return await super().start()


def make(a: argparse.Namespace) -> service.Component:
    forwarder = Forwarder(service.nats_access(a, "node"))
    return FrontGateway(forwarder, Gateway(forwarder, a.listen, a.reply_timeout, tls=service.server_tls(a)))


def build_parser() -> argparse.ArgumentParser:
    p = service.parser("python -m scaler.gateway", __doc__, uses_clock=False)
    add_options(p)
    return p


def main() -> None:
    service.main(make, build_parser().parse_args())


if __name__ == "__main__":
    main()
