"""How a component reaches NATS: the URL, the TLS it speaks, and who it says it is.

One frozen value built from the flags (scaler/runtime/service.py, `nats_access`) and handed to
`bus.connect`, the one place connections are made. A component given a bare URL (tests, tools)
connects as before: no TLS unless the URL says `tls://`, no credentials unless the URL carries them.
It prints as its URL with any password left out, so it can be logged.

Each role's answers come to inboxes of its own (`_INBOX.<role>.…`): NATS can then let a worker hear its
own answers without hearing a node's (the snapshots a node reads, the answers it is sent), as
deploy/nats.conf does.
"""

import logging
import ssl
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client

from scaler.runtime import reload
from scaler.runtime.tls import CannotRead, ClientTls, read


@dataclass(frozen=True)
class NatsAccess:
    url: str
    tls: ClientTls = field(default_factory=lambda: ClientTls(flags="--nats"))
    creds: str = ""  # a .creds file: a user JWT and its nkey seed (an operator-mode server)
    nkey: str = ""  # a file holding an nkey seed (a server that lists users by public nkey)
    user: str = ""
    password_file: str = ""  # the user's password, in a file (never on a command line)
    role: str = ""  # node, worker or reader: where its answers come (`inbox`); "" for NATS's own inboxes

    def __str__(self) -> str:
        return redacted(self.url)

    def options(self) -> dict[str, Any]:
        """nats-py's `connect` keyword arguments for this access; files are read now (CannotRead if one cannot be)."""
        out: dict[str, Any] = {}
        if self.role:
            out["inbox_prefix"] = inbox(self.role)
        if self.tls.on or any(u.startswith("tls://") for u in self.servers):
            out["tls"] = _contexts(self.tls).value
            logging.getLogger("asyncio").addFilter(_quiet_tls_eof)
        if self.creds:
            read(self.creds, "--nats-creds")
            out["user_credentials"] = self.creds
        if self.nkey:
            read(self.nkey, "--nats-nkey")
            out["nkeys_seed"] = self.nkey
        if bool(self.user) != bool(self.password_file):
            raise CannotRead("--nats-user and --nats-password-file go together")
        if self.user:
            out["user"] = self.user
            out["password"] = read(self.password_file, "--nats-password-file").decode().strip()
        return out

    @property
    def servers(self) -> list[str]:
        return servers(self.url)


def inbox(role: str) -> str:
    """The prefix of the inboxes a role's connections hear their answers on."""
    return f"_INBOX.{role}"


def _quiet_tls_eof(record: logging.LogRecord) -> bool:
    """asyncio warns at each TLS connection nats-py's reader sees end ("returning true from eof_received() has no
    effect when using ssl"): about nats-py's protocol class, nothing an operator can act on."""
    return "eof_received" not in record.getMessage()


Nats = str | NatsAccess  # what a component is given to reach NATS: a bare URL, or the whole access


def access(nats: Nats) -> NatsAccess:
    return nats if isinstance(nats, NatsAccess) else NatsAccess(nats)


def url_of(nats: Nats) -> str:
    return nats.url if isinstance(nats, NatsAccess) else nats


def servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` -> each server of a cluster (nats-py wants a list)."""
    return [u.strip() for u in url.split(",") if u.strip()]


def redacted(url: str) -> str:
    """The URL(s) without passwords: `nats://user:secret@host` -> `nats://user@host`."""
    out = []
    for u in servers(url):
        parts = urlsplit(u if "://" in u else f"nats://{u}")
        if parts.password is None:
            out.append(u)
            continue
        host = parts.netloc.rsplit("@", 1)[1]
        out.append(urlunsplit(parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host)))
    return ",".join(out)


def follow(nc: Client, nats: Nats) -> None:
    """Let `nc` connect again (after an outage, to another server of a cluster) with its TLS files as they are then:
    nats-py takes its `tls` option anew at each connection. The connection open keeps the TLS session it made."""
    tls = access(nats).tls
    if not tls.on:
        return
    client = weakref.ref(nc)

    def alive() -> bool:
        nc = client()
        return nc is not None and not nc.is_closed

    def use(context: ssl.SSLContext) -> None:
        if (nc := client()) is not None:
            nc.options["tls"] = context

    _contexts(tls).use(use, alive)


def _contexts(tls: ClientTls) -> reload.Watched[ssl.SSLContext]:
    return tls.watched(ClientTls.context, "TLS to NATS")
