"""`scaler node`: the gRPC Scaler service and the controller in one process: one hop per decision.

A call is validated, decided under its function's lock, its batch appended to the event stream,
and answered once stored: no other process on the way. The workers run apart (`python -m scaler.workers`).

On SIGTERM (or `scaler drain`) the node drains before it stops: it hands its partitions to the
other nodes, each snapshotted under its lease, while its gRPC port still serves (passing calls on
to the new owners), then answers the Idle of each request it assigned that is still under way (for
10 s at most), and only then stops serving (docs/sessions-and-admin.md).
"""

import argparse
import asyncio
import logging
import signal

from scaler.controller import __main__ as controller_main
from scaler.controller import needs
from scaler.controller.metrics import ControllerCollector
from scaler.controller.shell import Controller
from scaler.gateway import __main__ as gateway_main
from scaler.gateway import info
from scaler.gateway.admin import Precondition
from scaler.gateway.server import Gateway
from scaler.proto.info import Info
from scaler.runtime import durability, identity, metrics, service, storehealth
from scaler.runtime.permissions import Preflight
from scaler.runtime.ports import port
from scaler.runtime.storehealth import StoreWatch

log = logging.getLogger("scaler.node")

OWED_S = 10.0  # how long a node that handed its partitions over still waits for the Idles of what it assigned


def add_arguments(p: argparse.ArgumentParser) -> None:
    service.add_common(p)
    gateway_main.add_options(p)
    controller_main.add_options(p)
    p.add_argument(
        "--metrics-port",
        type=port,
        default=service.env("METRICS_PORT", None),
        metavar="N",
        help="serve Prometheus metrics on http://HOST:N/metrics, HOST being --listen's (0: any free port; default:"
        " none) [SCALER_METRICS_PORT]",
    )
    p.add_argument(
        "--admin-token-file",
        default=service.env("ADMIN_TOKEN_FILE", ""),
        metavar="PATH",
        help="the key Admin calls (`scaler functions|restart|delete|drain`) must carry; a random one is made there"
        " if the file does not exist. Without it Admin serves only a --listen on loopback, and a node listening"
        " beyond refuses to start (docs/security.md) [SCALER_ADMIN_TOKEN_FILE]",
    )
    p.add_argument(
        "--node-dir",
        default=service.env("NODE_DIR", ""),
        metavar="DIR",
        help="a folder of this node's own, where its name is kept (DIR/name, locked while it runs): restarted"
        " with the same folder, the node takes its partitions' leases back at once instead of waiting for"
        " them to lapse (default: a new name at each start) [SCALER_NODE_DIR]",
    )


class Node(service.Together):
    """The controller, the gateway and metrics; a stop drains the controller first, the gateway still serving,
    and, once another node decides for its partitions, still answers the Idle of each request it assigned."""

    def __init__(
        self,
        controller: Controller,
        gateway: Gateway,
        parts: list[service.Component],
        store: StoreWatch | None = None,
        node_dir: str = "",
    ) -> None:
        super().__init__(parts)
        self.controller = controller
        self.gateway = gateway
        self.store = store  # what NATS's health checks say of the event store
        self.node_dir = node_dir  # where its name is kept and held (runtime/identity.py)

    async def start(self) -> str:
        self.gateway.check()  # a certificate it cannot read, an Admin it may not serve: said before the controller
        if self.node_dir:  # its earlier incarnation, if any, is dead: its leases are this one's to take back
            self.controller.node = await identity.claim_name(self.node_dir)
            self.controller.reclaim_leases = True
        said = await super().start()
        self.controller.address = f"{self.gateway.listen.rpartition(':')[0]}:{self.gateway.port}"  # `scaler nodes`
        if self.store is not None:
            self.store.start()
        return said

    async def stop(self) -> None:
        if self.store is not None:
            await self.store.stop()
        try:
            await self.controller.drain()
        except Exception as e:  # the stop goes on: what was not handed over is given back or lapses
            log.warning("could not drain: %s", e)
        if not self.controller.serving:  # handed over: an Idle that comes here is passed on to the new owner
            if owed := await self.gateway.owed.settled(OWED_S):
                log.warning("stopping with %d requests assigned here still out (after %g s)", owed, OWED_S)
        await super().stop()

    async def drain_and_stop(self, force: bool = False) -> str:
        """scaler.Admin/Drain: drain now, answer, then stop as on SIGTERM. The only node refuses unless forced:
        nobody would take its partitions, and under `scaler up` it would be started again at once."""
        if not force and not await self.controller.others_up():
            raise Precondition(
                f"{self.controller.node} is the only node: nobody would take its partitions (and `scaler up` would"
                " start it again); --force stops it all the same"
            )
        said = await self.controller.drain()
        asyncio.get_running_loop().call_later(0.1, signal.raise_signal, signal.SIGTERM)
        return said


def make(a: argparse.Namespace) -> service.Component:
    controller = controller_main.make(a)
    nats = info.without_credentials(a.nats)

    def says() -> Info:  # `scaler simulate` checks these before it begins; `scaler replay` finds the stream here
        instances = sum(len(s.instances) for s in controller.ledger.states.values())
        return Info(speed=float(a.speed), policy=a.policy, instances=instances, nats=nats)

    gateway = Gateway(
        controller, a.listen, a.reply_timeout, says, tls=service.server_tls(a), admin_token_file=a.admin_token_file
    )
    store = StoreWatch(durability.monitor_urls(a.nats, a.nats_monitor), progress=lambda: controller.ledger.seq)
    gateway.store = store
    parts = [Preflight(controller.nats_url, "node", needs.NODE), controller, gateway]
    if a.metrics_port is not None:
        host = a.listen.rpartition(":")[0]
        collectors = [ControllerCollector(controller), store]
        health = {"/healthz": lambda: storehealth.page(store.describe() or controller.trouble())}
        parts.append(metrics.endpoint(f"{host}:{a.metrics_port}", collectors, health))
    node = Node(controller, gateway, parts, store, a.node_dir)
    gateway.drain = node.drain_and_stop
    return node


def run(args: argparse.Namespace) -> int:
    service.main(make, args)
    return 0
