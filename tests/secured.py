"""A nats-server configured with deploy/nats.conf as written (its certificates' paths pointed at a test's own), and
how each role reaches it: TLS with a certificate the test's CA signed, and the role's user.

Used by the tests of who may do what (tests/system/test_security.py, test_privileges.py) and of rotating
certificates (test_rotation.py).
"""

import os
import secrets
from pathlib import Path

import nkeys

from scaler.runtime.access import NatsAccess
from scaler.runtime.natsd import NatsServer
from scaler.runtime.tls import ClientTls
from tests.certs import Authority

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("node", "worker", "reader")


def nats_configuration(certs: Path) -> str:
    """deploy/nats.conf, its certificates in `certs`."""
    return (ROOT / "deploy" / "nats.conf").read_text().replace("/etc/nats/certs/", f"{certs}/")


def write(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


class Secured:
    """A nats-server as deploy/nats.conf configures it, and how each role reaches it. `certs`: where the server's
    certificate, key and CA are (`nats.pem`, `nats.key`, `ca.pem`; the CA's folder unless told)."""

    def __init__(self, folder: Path, ca: Authority, certs: Path | None = None, extra: str = "") -> None:
        self.folder = folder
        self.ca = ca
        ca.issue("nats")
        self.public: dict[str, str] = {}  # each nkey's public half, for the server's environment
        self.seeds = {role: self._seed(role) for role in ("node", "worker")}
        self.password = write(folder / "reader.pw", secrets.token_hex(16))  # the server parses it from its environment
        config = nats_configuration(certs or Path(ca.folder))
        self.server = NatsServer(folder / "nats", extra=f"{config}\n{extra}" if extra else config)
        self.url = ""

    def _seed(self, role: str) -> Path:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        self.public[f"{role.upper()}_NKEY"] = nkeys.from_seed(bytearray(seed)).public_key.decode()
        path = self.folder / f"{role}.seed"
        path.write_bytes(seed + b"\n")
        return path

    async def __aenter__(self) -> "Secured":
        await self.start()
        return self

    async def start(self) -> None:
        os.environ.update(self.public, READER_PASSWORD=self.password.read_text().strip())  # the server's environment
        try:
            await self.server.start()
        finally:
            for var in ("NODE_NKEY", "WORKER_NKEY", "READER_PASSWORD"):
                os.environ.pop(var, None)
        self.url = self.server.url
        assert self.url.startswith("tls://")

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop()

    def env(self, role: str, name: str = "") -> dict[str, str]:
        """The SCALER_NATS_* variables a process of `role` is given (each with a certificate of its own, `name`)."""
        pair = self.ca.issue(name or role)
        out = {"SCALER_NATS_URL": self.url, "SCALER_NATS_CA": self.ca.ca}
        out |= {
            "SCALER_NATS_CERT": pair.cert,
            "SCALER_NATS_KEY": pair.key,
            "SCALER_NATS_MONITOR": self.server.monitor_url,
        }
        if role == "reader":
            return out | {"SCALER_NATS_USER": "reader", "SCALER_NATS_PASSWORD_FILE": str(self.password)}
        return out | {"SCALER_NATS_NKEY": str(self.seeds[role])}

    def access(self, role: str) -> NatsAccess:
        """How a process of `role` reaches the server, as its flags would say."""
        e = self.env(role)
        tls = ClientTls(e["SCALER_NATS_CA"], e["SCALER_NATS_CERT"], e["SCALER_NATS_KEY"], flags="--nats")
        if role == "reader":
            return NatsAccess(self.url, tls, user="reader", password_file=e["SCALER_NATS_PASSWORD_FILE"], role=role)
        return NatsAccess(self.url, tls, nkey=e["SCALER_NATS_NKEY"], role=role)
