"""The key an Admin call must carry: `authorization: Bearer <token>` in its gRPC metadata.

A node given a key (`--admin-token-file`) refuses every Admin call without it: UNAUTHENTICATED when none is
carried (or not in that form), PERMISSION_DENIED when it is the wrong one, compared in constant time; each
refusal is one log line naming the caller's address, never what it sent. A node without a key serves Admin
only on a loopback listener, where its callers are this machine's (as Redis's protected mode does); on any
other address it refuses to start. A key file that does not exist is made, with a new random key readable by
its owner only: a node started with `--admin-token-file` always has a key.
"""

import hmac
import logging
import os
import secrets
from pathlib import Path

import grpc

from scaler.runtime.tls import CannotRead

log = logging.getLogger("scaler.admin")

METADATA = "authorization"
SCHEME = "Bearer "
FLAG = "--admin-token-file"


class AdminOpen(RuntimeError):
    """Admin would serve, without a key, callers beyond this machine."""


def load(path: str, make: bool = False) -> bytes:
    """The key in `path` (surrounding whitespace dropped); with `make`, a new random one is written there first if
    the file does not exist. CannotRead when it cannot be read (or made), or holds nothing."""
    file = Path(path)
    if make and not file.exists():
        _make(file)
    try:
        token = file.read_bytes().strip()
    except OSError as e:
        raise CannotRead(f"cannot read {FLAG} {path}: {e.strerror or e}") from None
    if not token:
        raise CannotRead(f"{FLAG} {path} is empty")
    return token


def _make(file: Path) -> None:
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made meanwhile (another node on the same file): theirs is the key
        return
    except OSError as e:
        raise CannotRead(f"cannot make {FLAG} {file}: {e.strerror or e}") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    log.info("admin key made in %s (readable by its owner only): give it to `scaler functions` with %s", file, FLAG)


def metadata(token: bytes) -> tuple[tuple[str, str], ...]:
    """What a client puts in an Admin call's metadata to carry `token`."""
    return ((METADATA, SCHEME + token.decode()),)


def refusal(key: bytes, context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
    """Why the call must be refused (its status and message), or None when it carries `key`."""
    said = [value for name, value in context.invocation_metadata() or () if name == METADATA]
    if len(said) != 1 or not isinstance(said[0], str) or not said[0].startswith(SCHEME):
        return grpc.StatusCode.UNAUTHENTICATED, f"Admin needs the node's key: `{METADATA}: {SCHEME}<token>`"
    if not hmac.compare_digest(said[0][len(SCHEME) :].strip().encode(), key):
        return grpc.StatusCode.PERMISSION_DENIED, "wrong admin key"
    return None
