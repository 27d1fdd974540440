"""TLS for every hop we serve or call: the files an operator names, read at start, and what gRPC and NATS want of them.

A listener serves TLS when given a certificate and its key; with a client CA it also asks each caller for a
certificate that CA signed (mutual TLS). A client speaks TLS when given a CA to trust (a bundle of the system's
trusts what the system does) or a certificate of its own. A file that cannot be read is said at start, in one
line naming its flag.
"""

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc


class CannotRead(ValueError):
    """A certificate, key or secret named by a flag cannot be read, or is given without its pair."""


def read(path: str, flag: str) -> bytes:
    """The file's bytes; CannotRead naming the flag when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CannotRead(f"cannot read {flag} {path}: {e.strerror or e}") from None


def _pair(cert: str, key: str, flags: str) -> None:
    if bool(cert) != bool(key):
        given, missing = ("cert", "key") if cert else ("key", "cert")
        raise CannotRead(f"{flags}-{given} needs {flags}-{missing}")


@dataclass(frozen=True)
class ServerTls:
    """A listener's certificate and key; with `client_ca`, callers must show a certificate it signed."""

    cert: str
    key: str
    client_ca: str = ""
    flags: str = field(default="--tls", compare=False)  # the flags' prefix, for messages

    def credentials(self) -> grpc.ServerCredentials:
        if not (self.cert or self.key):
            raise CannotRead(f"{self.flags}-client-ca needs {self.flags}-cert and {self.flags}-key")
        _pair(self.cert, self.key, self.flags)
        pair = (read(self.key, f"{self.flags}-key"), read(self.cert, f"{self.flags}-cert"))
        try:  # gRPC takes any bytes and fails each handshake later: the pair is checked here, once
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key)
        except ssl.SSLError as e:
            raise CannotRead(f"{self.flags}-cert and {self.flags}-key: not a certificate and its key ({e})") from None
        ca = read(self.client_ca, f"{self.flags}-client-ca") if self.client_ca else None
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (`ca`) and shows (`cert`, `key`); TLS is on when any is given."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    flags: str = field(default="", compare=False)  # the flags' prefix (`--platform`), for messages

    @property
    def on(self) -> bool:
        return bool(self.ca or self.cert or self.key)

    def credentials(self) -> grpc.ChannelCredentials:
        _pair(self.cert, self.key, self.flags)
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca, f"{self.flags}-ca") if self.ca else None,
            private_key=read(self.key, f"{self.flags}-key") if self.key else None,
            certificate_chain=read(self.cert, f"{self.flags}-cert") if self.cert else None,
        )

    def context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        """The same trust for Python's ssl (NATS, and the check of a platform's certificate at start)."""
        _pair(self.cert, self.key, self.flags)
        try:
            ctx = ssl.create_default_context(cafile=self.ca or None)
            if self.cert:
                ctx.load_cert_chain(self.cert, self.key)
        except FileNotFoundError as e:
            raise CannotRead(f"cannot read {self.flags} TLS file {e.filename}: {e.strerror}") from None
        except (OSError, ssl.SSLError) as e:
            raise CannotRead(f"{self.flags}-ca/-cert/-key: not a usable CA, certificate or key ({e})") from None
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx


def channel(target: str, tls: ClientTls | None = None, options: list | None = None) -> grpc.aio.Channel:
    """A channel to `target`: over TLS when `tls` is on, else in clear."""
    if tls is not None and tls.on:
        return grpc.aio.secure_channel(target, tls.credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


class Untrusted(ValueError):
    """A server's certificate fails the client's trust: a mistake in the configuration, not an outage."""


async def check_trust(target: str, tls: ClientTls | None, what: str, patience_s: float = 5.0) -> None:
    """Raise Untrusted in one line when `target` shows a certificate `tls` does not trust (or refuses ours).

    Said at start rather than left to gRPC, which retries a failed handshake as if it were an outage. A
    server not listening yet, or slow to answer, is not a mistake: it is left to the calls to wait for.
    """
    if tls is None or not tls.on:
        return
    host, _, port = target.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        async with asyncio.timeout(patience_s):
            _, writer = await asyncio.open_connection(
                host, int(port), ssl=tls.context(alpn=("h2",)), server_hostname=host
            )
            writer.close()
    except ssl.SSLCertVerificationError as e:
        raise Untrusted(f"cannot trust {what} at {target}: {e.verify_message} ({tls.flags}-ca)") from None
    except ssl.SSLError as e:
        raise Untrusted(f"TLS to {what} at {target} failed: {e.reason or e}") from None
    except (OSError, TimeoutError):
        return
