"""An operator's calls to a node: functions, instances, states, tenants' quotas, the nodes, and draining one.

They talk to any node's gRPC port (`scaler.Admin`, scaler/gateway/admin.py); a node passes what changes a
function on to the node that owns it, and asks the owner for one function's instances. `functions` lists
every function the running nodes hold, with its instances by phase; `drain` makes the node it calls hand
its partitions to the other nodes and stop (the only node refuses unless `--force`). Each call carries
the node's key (`--admin-token-file`) and speaks TLS when given a CA to trust (`--gateway-ca`;
docs/security.md).
"""

import argparse
import asyncio
import datetime
import sys

import grpc
import msgspec

from scaler.controller.core.policy import POLICIES
from scaler.controller.leases import ranges
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


def command(method: str, a: argparse.Namespace, body: Ask, show) -> int:
    """Make the call, print its answer (`show(answer)` yields the lines) or its refusal in one line."""
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
    else:
        for line in show(answer):
            print(line)
    return 0


def _said(a: argparse.Namespace):
    return lambda answer: [f"{a.key}: {answer.message}"]


def _ago(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ms else "-"


class List:
    """List the functions the running nodes hold, with their instances by phase."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--key", help="only this function")
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("List", a, Ask(key=a.key or ""), List.show)

    @staticmethod
    def show(answer: Answer):
        for f in answer.functions:
            phases = ", ".join(f"{len(ids)} {phase} ({' '.join(ids)})" for phase, ids in f.instances.items())
            extra = f"; {f.waiting} waiting" if f.waiting else ""
            extra += f"; {f.sessions} session(s)" if f.sessions else ""
            live = {i for ids in f.instances.values() for i in ids}
            for state, i in f.states.items():
                extra += (
                    f"; state {state} on {i}" if i in live else f"; state {state} ({i} went: moves at its next call)"
                )
            said = [f"tenant {f.tenant}" if f.tenant else "", f"version {f.version}" if f.version else ""]
            said += [f"policy {f.policy}" if f.policy else ""]
            said += [", ".join(f"{k} {v:g}" for k, v in f.limits.items())]
            extra += "".join(f"; {x}" for x in said if x)
            if f.deleted:
                yield f"{f.key}  DELETED ({f.deleted}): its calls are refused until `scaler create {f.key}`"
            else:
                yield f"{f.key}  {f.memory_mb} MB: {phases or 'no instances'}{extra}"
        if not answer.functions:
            yield "no functions"


class _Change:
    """A change to a function, decided by its owner and stored with the reason."""

    method = ""

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("key", metavar="KEY", help="the function's metaKey")
        cls.add_own(p)
        p.add_argument("--reason", default="", help="why, stored with the event")
        add_gateway(p)

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        pass

    @classmethod
    def run(cls, a: argparse.Namespace) -> int:
        return command(cls.method, a, cls.body(a), _said(a))

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(key=a.key, reason=a.reason)


class Restart(_Change):
    """Restart a function's instances: idle ones retire now, busy ones when released; new ones start on demand.
    With --instance, that instance alone, another one starting in its place at once."""

    method = "Restart"

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        p.add_argument("--instance", default="", metavar="ID", help="restart this instance alone")

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(key=a.key, reason=a.reason, instance=a.instance)


class Delete(_Change):
    """Delete a function: its instances are destroyed, its state forgotten, and its calls refused (NOT_FOUND)
    until `scaler create` (or a call naming another version)."""

    method = "Delete"


class Stop(_Change):
    """Stop one instance: it retires now, or once released when busy; none starts in its place."""

    method = "Stop"

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        p.add_argument("instance", metavar="INSTANCE", help="the instance's id (`scaler instances KEY`)")

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(key=a.key, reason=a.reason, instance=a.instance)


class Create(_Change):
    """Create a deleted function again: its calls are served again."""

    method = "Create"

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        p.add_argument("--version", default=None, help="the function's version from now on")

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(key=a.key, reason=a.reason, version=a.version)


class DeleteState(_Change):
    """Delete a state: its route goes and the instance that holds it retires (now, or once released)."""

    method = "DeleteState"

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        p.add_argument("state", metavar="STATE", help="the state's id (an Assign's scaler-state)")

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(key=a.key, reason=a.reason, state=a.state)


class Set(_Change):
    """Set a function's limits, exchange rate, policy or version while it runs (each an event; the rest as it is).

    A lowered --max retires idle instances past it at once and starts none beyond it; a new --version
    retires instances of another version as they become idle. The limits go over the limits file's."""

    method = "Set"

    @staticmethod
    def add_own(p: argparse.ArgumentParser) -> None:
        p.add_argument("--max", type=int, dest="max_instances", metavar="N", help="at most N instances (0: no cap)")
        p.add_argument("--max-memory", type=int, metavar="MB", help="at most MB of their memory (0: no cap)")
        p.add_argument("--min", type=int, dest="min_warm", metavar="N", help="keep N reserved instances ready")
        p.add_argument(
            "--exchange-rate",
            type=float,
            metavar="GB_S",
            help="learned's exchange rate for it: slot GB·s a second of its waiting is worth (0.1 to 1,000,000;"
            " docs/policies.md)",
        )
        p.add_argument("--reset-limits", action="store_true", help="the limits file's limits again (before the rest)")
        p.add_argument(
            "--policy",
            metavar="NAME",
            help=f'the policy that decides it ("": the node\'s; one of {", ".join(POLICIES)} or'
            " package.module:Class that every node can import)",
        )
        p.add_argument("--version", help="its version: instances of another one retire as they become idle")

    @staticmethod
    def body(a: argparse.Namespace) -> Ask:
        return Ask(
            key=a.key,
            reason=a.reason,
            max_instances=a.max_instances,
            max_memory_mb=a.max_memory,
            min_warm=a.min_warm,
            exchange_rate=a.exchange_rate,
            reset_limits=a.reset_limits,
            policy=a.policy,
            version=a.version,
        )


class Instances:
    """A function's instances with their stats (requests served, errors, busy time, state, sessions), from the
    node that owns it."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("key", metavar="KEY", help="the function's metaKey")
        p.add_argument("--instance", default="", metavar="ID", help="only this instance")
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("Instances", a, Ask(key=a.key, instance=a.instance), Instances.show)

    @staticmethod
    def show(answer: Answer):
        for i in answer.instances:
            mean = f", {i.busy_ms / i.served:.0f} ms each" if i.served else ""
            held = f"; state {i.state}" if i.state else ""
            held += f"; session(s) {' '.join(i.sessions)}" if i.sessions else ""
            held += f"; runs {i.request}" if i.request else ""
            held += f"; retires when released ({i.retires})" if i.retires else ""
            held += "; reserved" if i.reserved else ""
            at = f" version {i.version}" if i.version else ""
            yield (
                f"{i.id}  {i.phase} since {_ago(i.since_ms)}, {i.memory_mb} MB{at}: served {i.served}"
                f" ({i.errors} error(s)){mean}{held}"
            )


class Nodes:
    """The running nodes: where each serves, its partitions, and how long ago their leases were renewed."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("Nodes", a, Ask(), Nodes.show)

    @staticmethod
    def show(answer: Answer):
        for m in answer.nodes:
            beat = f"heartbeat {m['heartbeat_s']:.1f}s ago" if m.get("heartbeat_s") is not None else "NO heartbeat"
            parts = m.get("partitions", [])
            ages = m.get("lease_ages_s", [])
            leases = f", leases renewed {min(ages):.1f}-{max(ages):.1f}s ago" if ages else ""
            where = m.get("address") or "-"
            yield f"{m['node']}  {where}  partitions {ranges(parts)} ({len(parts)}){leases}; {beat}"
        if not answer.nodes:
            yield "no nodes"


class Tenants:
    """The tenants' quotas, and what their functions hold on every node."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("Tenants", a, Ask(), Tenants.show)

    @staticmethod
    def show(answer: Answer):
        def of(n: int) -> str:
            return str(n) if n else "no quota"

        for t in answer.tenants:
            yield (
                f"{t.tenant}  on demand {t.on_demand} of {of(t.max_on_demand)}, reserved {t.reserved}"
                f" of {of(t.max_reserved)}"
            )
        if not answer.tenants:
            yield "no tenants"


class Quota:
    """Set a tenant's quotas for every node (over the limits file's; --reset: the file's again)."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("tenant", metavar="TENANT")
        p.add_argument("--on-demand", type=int, metavar="N", help="at most N instances started on demand (0: none)")
        p.add_argument("--reserved", type=int, metavar="N", help="at most N reserved instances (0: none)")
        p.add_argument("--reset", action="store_true", help="the limits file's quotas again")
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        body = Ask(tenant=a.tenant, max_on_demand=a.on_demand, max_reserved=a.reserved, reset=a.reset)
        return command("Quota", a, body, lambda answer: [answer.message])


class Drain:
    """Drain a node: it hands its partitions to the other nodes, then stops (as on SIGTERM). The only node
    refuses (nobody would take its partitions, and `scaler up` would start it again) unless --force."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--force", action="store_true", help="stop it even if it is the only node")
        add_gateway(p)

    @staticmethod
    def run(a: argparse.Namespace) -> int:
        return command("Drain", a, Ask(force=a.force), lambda answer: [answer.message])
