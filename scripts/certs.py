#!/usr/bin/env python3
"""Credentials for a test deployment over TLS (compose.tls.yaml): a CA, a certificate for each service,
the NATS nkeys of the node and the workers, and the reader's password, all in DIR.

    python scripts/certs.py certs
    docker compose -f compose.yaml -f compose.tls.yaml up

Needs `cryptography` (the `test` extra). The keys are written readable by every user of the host, so that
the containers' unprivileged user can read them through the bind mount: fine for a test deployment, not for
a real one, whose keys come from its own CA and secret store (docs/security.md).
"""

import argparse
import os
import secrets
import sys
from pathlib import Path

import nkeys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.certs import Authority  # noqa: E402

SERVICES = ("nats", "node", "platform-stub", "platform-worker", "gc-worker", "operator")  # a certificate each
ROLES = ("node", "worker")  # an nkey each; the reader has a password


def seed(folder: Path, role: str) -> str:
    """Write ROLE.seed; return its public key, for the server's environment."""
    made = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    (folder / f"{role}.seed").write_bytes(made + b"\n")
    return nkeys.from_seed(bytearray(made)).public_key.decode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", metavar="DIR", help="where to write them (made if missing; files in it are replaced)")
    folder = Path(p.parse_args().folder)
    ca = Authority(folder, name="scaler test CA")
    for name in SERVICES:
        ca.issue(name, (name, "localhost", "127.0.0.1"))
    server_env = {f"{role.upper()}_NKEY": seed(folder, role) for role in ROLES}
    password = secrets.token_hex(16)  # letters and digits: nats-server parses it from its environment
    (folder / "reader.pw").write_text(password + "\n")
    server_env["READER_PASSWORD"] = password
    (folder / "nats.env").write_text("".join(f"{k}={v}\n" for k, v in server_env.items()))
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o755)
    print(f"wrote {len(list(folder.iterdir()))} files to {folder}: the CA (ca.pem), a certificate and key per service,"
          " node.seed, worker.seed, reader.pw and nats.env (the server's side of them)")  # fmt: skip


if __name__ == "__main__":
    main()
