"""The key an Admin call must carry: `authorization: Bearer <token>` in its gRPC metadata.

A node given a key (`--admin-token-file`) refuses every Admin call without it: UNAUTHENTICATED when none is
carried (or not in that form), PERMISSION_DENIED when it is the wrong one, compared in constant time; each
refusal is one log line naming the caller's address, never what it sent. A node without a key serves Admin
only on a loopback listener, where its callers are this machine's (as Redis's protected mode does); on any
other address it refuses to start. A key file that does not exist is made, with a new random key readable by
its owner only: a node started with `--admin-token-file` always has a key.

The file may hold several keys, one a line: a node takes any of them, a client sends the first. A key is so
replaced without a refused call, the file read again when it changes (scaler/runtime/reload.py): the new key
put first, the old kept below it until every client has the new one, then the old taken away.
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
    """The key a client sends: the first in `path`; with `make`, a new random one is written there first if the file
    does not exist. CannotRead when it cannot be read (or made), or holds nothing."""
    return keys(path, make)[0]


def keys(path: str, make: bool = False) -> tuple[bytes, ...]:
    """Every key in `path` (one a line, surrounding whitespace dropped): those a node takes."""
    file = Path(path)
    if make and not file.exists():
        _make(file)
    try:
        found = tuple(line.strip() for line in file.read_bytes().splitlines() if line.strip())
    except OSError as e:
        raise CannotRead(f"cannot read {FLAG} {path}: {e.strerror or e}") from None
    if not found:
        raise CannotRead(f"{FLAG} {path} is empty")
    return found


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


def refusal(taken: tuple[bytes, ...], context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
    """Why the call must be refused (its status and message), or None when it carries one of the keys `taken`."""
    said = [value for name, value in context.invocation_metadata() or () if name == METADATA]
    if len(said) != 1 or not isinstance(said[0], str) or not said[0].startswith(SCHEME):
        return grpc.StatusCode.UNAUTHENTICATED, f"Admin needs the node's key: `{METADATA}: {SCHEME}<token>`"
    carried = said[0][len(SCHEME) :].strip().encode()
    if not any([hmac.compare_digest(carried, key) for key in taken]):  # every key compared: no time said which
        return grpc.StatusCode.PERMISSION_DENIED, "wrong admin key"
    return None
