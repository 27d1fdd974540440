"""Credentials made for a test: a CA, and certificates it signs for 127.0.0.1 and localhost (server and client);
and an operator-mode NATS (accounts as JWTs) with `.creds` files for its users.

Made with `cryptography` and `nkeys` in the test's temp folder, EC P-256, valid for a day; nothing is shipped.
"""

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NAMES = ("localhost", "127.0.0.1")
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


class Authority:
    """A CA in `folder`: `ca.pem`, and pairs it signs (`issue`)."""

    def __init__(self, folder: Path, name: str = "test CA") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._subject = subject
        self._cert = (
            _builder(subject, subject, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )  # certificate and CRL signing
            .sign(self._key, hashes.SHA256())
        )
        self.ca = str(self.folder / "ca.pem")
        Path(self.ca).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, names: tuple[str, ...] = NAMES) -> Pair:
        """A certificate for `names` (DNS names or IP addresses), good for a server and a client alike."""
        key = ec.generate_private_key(ec.SECP256R1())
        alt = [_general_name(n) for n in names]
        cert = (
            _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), self._subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        pair = Pair(str(self.folder / f"{name}.pem"), str(self.folder / f"{name}.key"))
        Path(pair.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(pair.key).write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return pair


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


class Operator:
    """An operator, its system account and one account (`SCALER`, JetStream on), as `nsc` would make them: the
    server's configuration (`config`), and users of the account in `.creds` files (`creds`)."""

    def __init__(self) -> None:
        self._key = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
        self._system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        self._account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True}
        unlimited |= {"conn": -1, "leaf": -1}
        jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
        self._jwts = {
            self._system.public_key.decode(): _jwt(self._key, self._system, "SYS", {"limits": unlimited}, "account"),
            self._account.public_key.decode(): _jwt(
                self._key, self._account, "SCALER", {"limits": unlimited | jetstream}, "account"
            ),
        }

    def config(self) -> str:
        operator = _jwt(self._key, self._key, "scaler test operator", {}, "operator")
        preload = ", ".join(f"{k}: {v}" for k, v in self._jwts.items())
        system = self._system.public_key.decode()
        return f"operator: {operator}\nsystem_account: {system}\nresolver: MEMORY\nresolver_preload: {{ {preload} }}\n"

    def creds(self, path: Path, name: str) -> Path:
        """A user of the account, unrestricted, written as nsc writes a `.creds` file."""
        user = _keypair(nkeys.PREFIX_BYTE_USER)
        claims = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}
        token = _jwt(self._account, user, name, claims, "user")
        path.write_text(
            f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
        )
        return path


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(issuer: nkeys.KeyPair, subject: nkeys.KeyPair, name: str, nats: dict, kind: str) -> str:
    """A NATS JWT (version 2) for `subject`, signed by `issuer`."""
    claims = {"jti": "", "iat": int(time.time()), "iss": issuer.public_key.decode(), "name": name}
    claims |= {"sub": subject.public_key.decode(), "nats": nats | {"type": kind, "version": 2}}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims).encode()).digest()).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(issuer.sign(f'{head}.{body}'.encode()))}"
