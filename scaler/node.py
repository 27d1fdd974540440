"""`scaler node`: the gRPC Scaler service and the controller in one process: one hop per decision.

A call is validated, decided under its function's lock, its batch appended to the event stream,
and answered once stored: no other process on the way. The workers run apart (`python -m workers`).
"""

import argparse

from controller import __main__ as controller_main
from controller.metrics import ControllerCollector
from gateway import __main__ as gateway_main
from gateway.server import Gateway
from runtime import metrics, service
from runtime.ports import port


def add_arguments(p: argparse.ArgumentParser) -> None:
    service.add_common(p)
    gateway_main.add_options(p)
    controller_main.add_options(p)
    p.add_argument(
        "--metrics-port",
        type=port,
        default=service.env("METRICS_PORT", None),
        metavar="N",
        help="serve Prometheus metrics on http://0.0.0.0:N/metrics (0: any free port; default: none)"
        " [SCALER_METRICS_PORT]",
    )


def make(a: argparse.Namespace) -> service.Component:
    controller = controller_main.make(a)
    says = {"speed": a.speed, "policy": a.policy}  # checked by `scaler simulate` before it begins
    parts = [controller, Gateway(controller, a.listen, a.reply_timeout, says)]
    if a.metrics_port is not None:
        parts.append(metrics.endpoint(f"0.0.0.0:{a.metrics_port}", [ControllerCollector(controller)]))
    return service.Together(parts)


def run(args: argparse.Namespace) -> int:
    service.main(make, args)
    return 0
