"""Certificates made for a test: a CA, and certificates it signs for 127.0.0.1 and localhost (server and client).

Made with `cryptography` in the test's temp folder, EC P-256, valid for a day; nothing is shipped.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

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
