"""`scaler node`: the gRPC Scaler service and the controller in one process: one hop per decision.

A call is validated, decided under its function's lock, its batch appended to the event stream,
and answered once stored: no other process on the way. The workers run apart (`python -m workers`).
"""

import argparse

from controller import __main__ as controller_main
from gateway import __main__ as gateway_main
from gateway.server import Gateway
from runtime import service


def add_arguments(p: argparse.ArgumentParser) -> None:
    service.add_common(p)
    gateway_main.add_options(p)
    controller_main.add_options(p)


def make(a: argparse.Namespace) -> service.Component:
    controller = controller_main.make(a)
    return service.Together([controller, Gateway(controller, a.listen, a.reply_timeout)])


def run(args: argparse.Namespace) -> int:
    service.main(make, args)
    return 0
