"""Listening: ports and addresses checked when they are parsed, and gRPC servers that own their port.

A listener given a ServerTls (scaler/runtime/tls.py) serves TLS only; without one, only in clear.

gRPC binds with SO_REUSEPORT by default: a second server on a port in use starts without a word
and the kernel splits the clients between the two. Our servers turn it off, so a port in use is
an error, said in one line.
"""

import argparse
import ipaddress
import random
import socket
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import grpc

from scaler.runtime.tls import ServerTls

GRPC_OPTIONS = [("grpc.so_reuseport", 0)]


class CannotListen(RuntimeError):
    """The address cannot be served (in use, not allowed, not an address of this machine)."""

    def __init__(self, listen: str, why: str, what: str = "") -> None:
        super().__init__(f"cannot listen{f' for {what}' if what else ''} on {listen}: {why}")
        self.listen = listen
        self.why = why


GIVEN_KEPT = 1_000  # ports free_port handed out lately, not handed out again (none of them may be bound yet)
_given: deque[int] = deque(maxlen=GIVEN_KEPT)


def free_port() -> int:
    """A port for a process to bind later, from below the kernel's ephemeral range: one the kernel hands
    out (bind to port 0, or any outgoing connection's local port) can be taken again before that bind.
    Never one it gave lately: several drawn before any is bound (a cluster's, compose's services') could
    otherwise meet."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: whatever the kernel gives
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for candidate in random.sample(range(max(1024, low - 12_000), low), 200):
        if candidate in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        _given.append(candidate)
        return candidate
    raise CannotListen("127.0.0.1", "no free port below the ephemeral range")


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 meaning any free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0-65535)")
    return value


def address(text: str) -> str:
    """An argparse type: HOST:PORT (HOST may be empty, or [IPv6]); the port as `port` accepts it."""
    _, sep, number = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    port(number)
    return text


def peer(text: str) -> str:
    """An argparse type: HOST:PORT of a server to call (a host, and a port from 1)."""
    host, _, number = address(text).rpartition(":")
    if not host.strip("[]"):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}: no host")
    if port(number) == 0:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}: port 0 is no server's")
    return text


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def nats_url(text: str) -> str:
    """An argparse type: a NATS URL, or several separated by commas (nats://HOST:PORT, tls://..., ws://...; a bare
    HOST:PORT is nats://, as nats-py takes it)."""
    for one in text.split(","):
        parts = urlsplit(one.strip() if "://" in one else f"nats://{one.strip()}")
        if parts.scheme not in NATS_SCHEMES or not parts.hostname:
            raise argparse.ArgumentTypeError(f"not a NATS URL: {one.strip()!r} (e.g. nats://127.0.0.1:4222)")
        try:
            parts.port  # noqa: B018 (out of range raises)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a NATS URL: {one.strip()!r}: port out of range (1-65535)") from None
    return text


UNREAD_CALLS = 20_000  # calls gRPC's core holds before the application reads them (memory stays bounded)
UNREAD_FOR_S = 3_600  # ... and for how long: the callers' own deadlines end them first


def grpc_server(max_calls: int | None = None) -> grpc.aio.Server:
    """A server that owns its port; with `max_calls`, one that takes up to that many calls at once and refuses
    those past it with RESOURCE_EXHAUSTED.

    gRPC's core holds the calls the application has not read yet; its aio server reads one every few turns
    of the event loop, so a loop kept busy reads a burst slowly. By default the core cancels what it holds
    past 1,000 calls (some at random up to 3,000) or after 30 s held: a CANCELLED call is a failed request, and
    those past `max_calls` would be cancelled rather than refused. So it holds UNREAD_CALLS, as long as their
    callers wait: each is read in the end, and served or refused then.
    """
    unread = [
        ("grpc.server.max_pending_requests", UNREAD_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", UNREAD_CALLS),
        ("grpc.server_max_unrequested_time_in_server", UNREAD_FOR_S),
    ]
    return grpc.aio.server(maximum_concurrent_rpcs=max_calls, options=GRPC_OPTIONS + unread)


def bind(server: grpc.aio.Server, listen: str, tls: ServerTls | None = None) -> int:
    """Add `listen` to the server (over TLS with `tls`) and return the port it got; raise CannotListen saying why
    not (a certificate that cannot be read: tls.CannotRead)."""
    credentials = tls.credentials() if tls is not None else None
    try:
        got = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
    except RuntimeError:
        got = 0
    if got == 0:
        raise CannotListen(listen, why_not(listen))
    return got


def why_not(listen: str) -> str:
    """Why a bind to `listen` fails, in the kernel's words (asked after gRPC failed, which does not say)."""
    host, _, number = listen.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(number), type=socket.SOCK_STREAM)
        family, kind, proto, _, where = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as e:
        return e.strerror or str(e)
    except ValueError:
        return "not an address"
    return "gRPC refused it"


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT can be reached from this machine only (127.0.0.0/8, ::1, localhost); an empty host,
    0.0.0.0 or [::] is every interface."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: whatever it resolves to may change; not counted as loopback
        return False
