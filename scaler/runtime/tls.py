"""TLS for every hop we serve or call: the files an operator names, and what gRPC and NATS want of them.

A listener serves TLS when given a certificate and its key; with a client CA it also asks each caller for a
certificate that CA signed (mutual TLS). A client speaks TLS when given a CA to trust (a bundle of the system's
trusts what the system does) or a certificate of its own. A file that cannot be read is said at start, in one
line naming its flag. The files are read again when they change (scaler/runtime/reload.py): a listener shows
the new certificate, and trusts the new client CA, from its next connection on; a client uses them for its next
channel or connection (`watched`), those open keeping the TLS session they made.
"""

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from scaler.runtime import reload

T = TypeVar("T")


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

    def check(self) -> grpc.ServerCertificateConfiguration:
        """The certificate, key and client CA as gRPC takes them, once each is checked usable: CannotRead if not."""
        if not (self.cert or self.key):
            raise CannotRead(f"{self.flags}-client-ca needs {self.flags}-cert and {self.flags}-key")
        _pair(self.cert, self.key, self.flags)
        pair = (read(self.key, f"{self.flags}-key"), read(self.cert, f"{self.flags}-cert"))
        ca = read(self.client_ca, f"{self.flags}-client-ca") if self.client_ca else None
        try:  # gRPC takes any bytes and fails each handshake later: the pair (and the CA) are checked here
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key)
        except ssl.SSLError as e:
            raise CannotRead(f"{self.flags}-cert and {self.flags}-key: not a certificate and its key ({e})") from None
        if ca is not None:
            try:
                ssl.create_default_context(cadata=ca.decode(errors="replace"))
            except (ssl.SSLError, ValueError) as e:
                raise CannotRead(f"{self.flags}-client-ca {self.client_ca}: not a CA certificate ({e})") from None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        """The listener's credentials, whose certificate, key and client CA are read again when their files change.
        Whether callers must show a certificate is settled here: a client CA given or taken away needs a restart."""
        files = reload.watch(reload.Watched(f"TLS ({self.flags}-cert, -key, -client-ca)", self._files, self.check))
        return grpc.dynamic_ssl_server_credentials(
            files.value, files.fetcher(), require_client_authentication=bool(self.client_ca)
        )

    @property
    def _files(self) -> tuple[str, ...]:
        return (self.cert, self.key, self.client_ca)


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
        self.context()  # gRPC takes any bytes and fails each handshake later: the files are checked here
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

    def watched(self, make: Callable[["ClientTls"], T], what: str) -> reload.Watched[T]:
        """What `make` makes of these files (channel credentials, an SSL context) as they are now, made again when
        they change while it has users: one for the process, however many channels or connections use it, so a
        change is one line."""
        key = (self, make)
        if (watched := _WATCHED.get(key)) is None:
            what, files = f"{what} ({self.flags}-ca, -cert, -key)", (self.ca, self.cert, self.key)
            watched = _WATCHED[key] = reload.Watched(what, files, lambda: make(self))
        else:
            watched.look()  # looked at only while it has users: as they are now
        return watched


_WATCHED: dict[tuple[ClientTls, Callable], reload.Watched] = {}


def channel(
    target: str,
    tls: ClientTls | None = None,
    options: list | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """A channel to `target`: over TLS when `tls` is on (with `credentials` made of it, or its files as they are
    now), else in clear."""
    if tls is not None and tls.on:
        return grpc.aio.secure_channel(target, credentials or tls.credentials(), options=options)
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


CLOSE_GRACE_S = 150.0  # how long calls under way on a channel made over files since replaced have to finish


class Channels:
    """A channel to `target`, made again over the new files each time `tls`'s change (scaler/runtime/reload.py):
    calls under way finish on the one before, which is closed once they are done. `took` is told each channel."""

    def __init__(
        self,
        target: str,
        tls: ClientTls | None,
        options: list,
        what: str,
        took: Callable[[grpc.aio.Channel], None],
    ) -> None:
        self.target = target
        self.tls = tls
        self.options = options
        self.took = took
        self._closing: dict[grpc.aio.Channel, asyncio.Task] = {}
        self._closed = False
        credentials = None
        if tls is not None and tls.on:
            files = tls.watched(ClientTls.credentials, f"TLS to {what}")
            files.use(self._renew, lambda: not self._closed)
            credentials = files.value
        self.channel = channel(target, tls, options, credentials)
        took(self.channel)

    def _renew(self, credentials: grpc.ChannelCredentials) -> None:
        old, self.channel = self.channel, channel(self.target, self.tls, self.options, credentials)
        self.took(self.channel)
        closing = asyncio.get_running_loop().create_task(old.close(grace=CLOSE_GRACE_S))
        self._closing[old] = closing
        closing.add_done_callback(lambda _: self._closing.pop(old, None))

    async def close(self) -> None:
        """Close every channel now, the calls still under way on one made before cancelled."""
        self._closed = True
        for old, closing in list(self._closing.items()):
            closing.cancel()
            await asyncio.gather(closing, return_exceptions=True)
            await old.close()
        await self.channel.close()
