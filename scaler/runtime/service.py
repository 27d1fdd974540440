"""How every component runs alone: configured by flags and SCALER_* variables, ready signalled, stopped cleanly."""

import argparse
import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from scaler.runtime import reload
from scaler.runtime.access import NatsAccess
from scaler.runtime.ports import nats_url
from scaler.runtime.tasks import say_where_tasks_wait
from scaler.runtime.tls import ClientTls, ServerTls

log = logging.getLogger("scaler")
T = TypeVar("T")

READY_FD = "SCALER_READY_FD"  # set by `scaler up`: where a child writes one line once it is ready


class Component(Protocol):
    async def start(self) -> str:
        """Start serving; return a short description for the ready line."""
        ...

    async def stop(self) -> None: ...


class Together:
    """Several components run as one: started in order, stopped in reverse."""

    def __init__(self, parts: list[Component]) -> None:
        self.parts = parts

    async def start(self) -> str:
        return "; ".join([await part.start() for part in self.parts])

    async def stop(self) -> None:
        for part in reversed(self.parts):
            await part.stop()


class Alongside(Together):
    """Independent components run as one: started in order, stopped all at once (each may wait out a grace)."""

    async def stop(self) -> None:
        await asyncio.gather(*(part.stop() for part in self.parts))


def addresses_of(component: Component) -> list[str]:
    """host:port each listening part of a component serves on, once started, in the parts' order."""
    out = []
    for part in getattr(component, "parts", [component]):
        listen, port = getattr(part, "listen", ""), getattr(part, "port", 0)
        if listen and port:
            out.append(f"{listen.rsplit(':', 1)[0]}:{port}")
    return out


def env(name: str, default: str) -> str:
    return os.environ.get(f"SCALER_{name}", default)


def parser(prog: str, description: str, uses_nats: bool = True, uses_clock: bool = True) -> argparse.ArgumentParser:
    """A parser with the options components share; each flag defaults to its SCALER_* variable.

    A component gets only the options it uses, so the variables its parser reads are exactly the
    ones it honours (compose.yaml is checked against them).
    """
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_common(p, uses_nats, uses_clock)
    return p


def add_common(p: argparse.ArgumentParser, uses_nats: bool = True, uses_clock: bool = True) -> None:
    if uses_nats:
        p.add_argument(
            "--nats",
            type=nats_url,
            default=env("NATS_URL", "nats://127.0.0.1:4222"),
            help="NATS URL(s), comma-separated; tls://HOST:PORT speaks TLS [SCALER_NATS_URL]",
        )
        add_nats_access(p)
    if uses_clock:
        p.add_argument(
            "--speed",
            type=positive,
            default=env("SPEED", "1"),
            help="run the clock N times faster, for simulations [SCALER_SPEED]",
        )
    add_log_level(p, env("LOG_LEVEL", "INFO"), "[SCALER_LOG_LEVEL]")


def add_nats_access(p: argparse.ArgumentParser) -> None:
    """How a process proves itself to NATS and whom it trusts there (docs/security.md)."""
    g = p.add_argument_group("NATS access", "TLS and credentials for NATS (docs/security.md)")
    _file(g, "--nats-ca", "NATS_CA", "trust NATS servers whose certificate this CA signed (turns TLS on)")
    _file(g, "--nats-cert", "NATS_CERT", "a client certificate, for NATS servers that verify clients")
    _file(g, "--nats-key", "NATS_KEY", "... and its key")
    _file(g, "--nats-creds", "NATS_CREDS", "a .creds file (user JWT and nkey seed)")
    _file(g, "--nats-nkey", "NATS_NKEY", "a file holding an nkey seed")
    g.add_argument("--nats-user", default=env("NATS_USER", ""), metavar="NAME", help="a NATS user [SCALER_NATS_USER]")
    _file(g, "--nats-password-file", "NATS_PASSWORD_FILE", "... and the file holding its password")


def _file(g: argparse._ArgumentGroup, flag: str, var: str, help: str) -> None:
    g.add_argument(flag, default=env(var, ""), metavar="PATH", help=f"{help} [SCALER_{var}]")


def nats_access(a: argparse.Namespace, role: str, url: str | None = None) -> NatsAccess:
    """The access the flags describe, to the URL of --nats (or `url`), for a process of `role` (node, worker, reader:
    deploy/nats.conf)."""
    return NatsAccess(
        url=url or a.nats,
        tls=ClientTls(a.nats_ca, a.nats_cert, a.nats_key, flags="--nats"),
        creds=a.nats_creds,
        nkey=a.nats_nkey,
        user=a.nats_user,
        password_file=a.nats_password_file,
        role=role,
    )


NATS_ACCESS_VARS = {  # each access flag's variable, for a process that passes the access on to its children
    "nats_ca": "NATS_CA",
    "nats_cert": "NATS_CERT",
    "nats_key": "NATS_KEY",
    "nats_creds": "NATS_CREDS",
    "nats_nkey": "NATS_NKEY",
    "nats_user": "NATS_USER",
    "nats_password_file": "NATS_PASSWORD_FILE",
}


def add_server_tls(p: argparse.ArgumentParser, what: str) -> None:
    """TLS for a gRPC listener: a certificate and key, and optionally a CA its callers' certificates must come from."""
    g = p.add_argument_group("TLS", f"TLS for {what} (docs/security.md); in clear without --tls-cert")
    _file(g, "--tls-cert", "TLS_CERT", f"serve {what} over TLS with this certificate (PEM)")
    _file(g, "--tls-key", "TLS_KEY", "... and its private key")
    _file(g, "--tls-client-ca", "TLS_CLIENT_CA", "require callers to show a certificate this CA signed (mutual TLS)")


def server_tls(a: argparse.Namespace) -> ServerTls | None:
    if not (a.tls_cert or a.tls_key or a.tls_client_ca):
        return None
    return ServerTls(a.tls_cert, a.tls_key, a.tls_client_ca)


def add_client_tls(p: argparse.ArgumentParser, prefix: str, var: str, what: str) -> None:
    """TLS for calls to `what`: `--<prefix>-ca` to trust, and a certificate of our own for servers that ask."""
    g = p.add_argument_group(f"TLS to {what}", f"in clear unless --{prefix}-ca or --{prefix}-cert is given")
    _file(g, f"--{prefix}-ca", f"{var}_CA", f"speak TLS to {what}, trusting certificates this CA signed")
    _file(g, f"--{prefix}-cert", f"{var}_CERT", f"a client certificate to show {what} (mutual TLS)")
    _file(g, f"--{prefix}-key", f"{var}_KEY", "... and its private key")


def client_tls(a: argparse.Namespace, prefix: str) -> ClientTls:
    dest = prefix.replace("-", "_")
    return ClientTls(
        getattr(a, f"{dest}_ca"), getattr(a, f"{dest}_cert"), getattr(a, f"{dest}_key"), flags=f"--{prefix}"
    )


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """An argparse type: a logging level's name, in any case."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown log level {text!r} (choose from {', '.join(LOG_LEVELS)})")
    return text.upper()


def add_log_level(p: argparse.ArgumentParser, default: str, help: str) -> None:
    p.add_argument("--log-level", type=log_level, default=default, metavar="LEVEL", help=help)


def positive(text: str) -> float:
    """An argparse type: a number above zero (a speed, a duration)."""
    value = _number(text)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def at_least(floor: float) -> Callable[[str], float]:
    """An argparse type: a number not below `floor`."""

    def parse(text: str) -> float:
        value = _number(text)
        if not value >= floor:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be at least {floor:.3g}, got {text}")
        return value

    return parse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def signal_ready(what: str, addresses: list[str] | None = None) -> None:
    """Log that the component is ready and, under `scaler up`, tell the supervisor (and where it listens)."""
    log.info("ready: %s", what)
    addresses = addresses or []
    _tell_supervisor({"what": what, "address": addresses[0] if addresses else "", "addresses": addresses})


def _tell_supervisor(message: dict) -> bool:
    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return False
    with os.fdopen(int(fd), "w") as f:
        f.write(json.dumps(message) + "\n")
    return True


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the way every process of ours is asked to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def main(make: Callable[[argparse.Namespace], Component], args: argparse.Namespace) -> None:
    """Run one component until SIGINT or SIGTERM, then stop it cleanly; at SIGHUP, read again the certificates,
    CAs and keys it uses that changed (scaler/runtime/reload.py: it also looks every second).

    A signal stops it at any time, starting included. A start that fails is said in one line
    (to `scaler up` when it runs under it, which says it) and the exit status is 1.
    """
    setup_logging(args.log_level)

    async def serve() -> bool:
        stop = stop_on_signals()
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload.hangup)  # certificates and keys replaced
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, say_where_tasks_wait)
        component = make(args)
        try:
            starting = asyncio.create_task(component.start())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():  # asked to stop before it was ready
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                return True
            stopping.cancel()
            try:
                what = starting.result()
            except Exception as e:
                if not _tell_supervisor({"error": str(e)}):
                    log.error("cannot start: %s", e, exc_info=log.isEnabledFor(logging.DEBUG))
                return False
            signal_ready(what, addresses_of(component))
            await stop.wait()
            return True
        finally:
            await component.stop()

    if not run(serve()):
        raise SystemExit(1)


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, on uvloop where it is installed (measured: ~13 % less latency and CPU per call)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
