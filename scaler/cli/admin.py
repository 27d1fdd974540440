"""`scaler functions`, `scaler restart KEY`, `scaler delete KEY`, `scaler drain`: an operator's calls to a node.

They talk to any node's gRPC port (`scaler.Admin`, scaler/gateway/admin.py); a node passes a restart or a
delete on to the node that owns the function. `functions` lists every function the running nodes
hold, with its instances by phase; `drain` makes the node it calls hand its partitions to the other
nodes and stop. Each call carries the node's key (`--admin-token-file`) and speaks TLS when given a CA
to trust (`--gateway-ca`; docs/security.md).
"""

import argparse
import asyncio
import sys

import grpc
import msgspec

from scaler.gateway import admin_key
from scaler.gateway.admin import SERVICE, Answer, Ask
from scaler.runtime import service, tls
from scaler.runtime.ports import peer

DEFAULT_GATEWAY = "127.0.0.1:9001"
TIMEOUT_S = 60.0


def add_gateway(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gateway", metavar="HOST:PORT", type=peer, default=DEFAULT_GATEWAY, help="a node's gRPC address")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument(
        "--admin-token-file",
        default=service.env("ADMIN_TOKEN_FILE", ""),
        metavar="PATH",
        help="the node's admin key (needed unless the node listens on loopback only) [SCALER_ADMIN_TOKEN_FILE]",
    )
    service.add_client_tls(p, "gateway", "GATEWAY", "the node")


async def ask(
    gateway: str, method: str, body: Ask, key: bytes | None = None, over: tls.ClientTls | None = None
) -> Answer:
    """The node's answer to one Admin call, carrying `key` (if any), over TLS when `over` is on."""
    metadata = admin_key.metadata(key) if key else None
    async with tls.channel(gateway, over) as channel:
        raw = await channel.unary_unary(f"/{SERVICE}/{method}")(
            msgspec.json.encode(body), timeout=TIMEOUT_S, metadata=metadata
        )
    return msgspec.json.decode(raw, type=Answer)


def command(method: str, a: argparse.Namespace) -> int:
    body = Ask(key=a.key or "", reason=getattr(a, "reason", ""))
    try:
        key = admin_key.load(a.admin_token_file) if a.admin_token_file else None
        answer = asyncio.run(ask(a.gateway, method, body, key, service.client_tls(a, "gateway")))
    except tls.CannotRead as e:
        print(f"scaler {a.command}: {e}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as e:
        print(f"scaler {a.command}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    if a.json:
        print(msgspec.json.encode(answer).decode())
    elif method == "Drain":
        print(answer.message)
    elif method == "List":
        for f in answer.functions:
            phases = ", ".join(f"{len(ids)} {phase} ({' '.join(ids)})" for phase, ids in f.instances.items())
            extra = f"; {f.waiting} waiting" if f.waiting else ""
            extra += f"; {f.sessions} session(s)" if f.sessions else ""
            print(f"{f.key}  {f.memory_mb} MB: {phases or 'no instances'}{extra}")
        if not answer.functions:
            print("no functions")
    else:
        print(f"{a.key}: {answer.message}")
    return 0


class List:
    """List the functions the running nodes hold, with their instances by phase."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--key", help="only this function")
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("List", a)


class _Change:
    method = ""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("key", metavar="KEY", help="the function's metaKey")
        p.add_argument("--reason", default="", help="why, stored with the event")
        add_gateway(p)

    @classmethod
    def run(cls, a: argparse.Namespace) -> int:
        return command(cls.method, a)


class Restart(_Change):
    """Restart a function's instances: idle ones retire now, busy ones when released; new ones start on demand."""

    method = "Restart"


class Delete(_Change):
    """Delete a function: its instances are destroyed and its state forgotten; a later Assign starts afresh."""

    method = "Delete"


class Drain:
    """Drain a node: it hands its partitions to the other nodes, then stops (as on SIGTERM)."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        a.key = ""
        return command("Drain", a)
