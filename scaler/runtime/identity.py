"""A node's name, kept in a folder of its own across restarts, and held by the running node alone.

A node restarted under the name it had takes back its leases at once (scaler/controller/leases.py)
instead of waiting for them to lapse: a crash then costs its restart, not the lease TTL. That is
safe only if the earlier incarnation is certainly dead, so the name is held by an flock on its file:
the kernel releases it when the process holding it dies, however it dies, and a process paused or
still stopping keeps it. The lock proves it on one machine; the folder is that machine's.
"""

import asyncio
import fcntl
import os
import re
import secrets
import socket
from pathlib import Path

NAME_FILE = "name"
VALID = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,99}")  # a JetStream KV key (leases and heartbeats use it)
WAIT_S = 10.0  # how long a start waits for an earlier incarnation to finish stopping


class NameBusy(RuntimeError):
    """Another running node holds this folder's name."""


def new_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "node"
    return f"{host}-{secrets.token_hex(3)}"


async def claim_name(folder: str | Path, wait_s: float = WAIT_S) -> str:
    """The name kept in `folder` (made on first use), held by this process until it exits.

    A name held by another process is waited for up to `wait_s` (an earlier incarnation still
    stopping), then refused with NameBusy. The lock is never let go by this process: it lives as
    long as the node does.
    """
    path = Path(folder)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while (fd := _locked(path)) is None:
        if loop.time() >= deadline:
            raise NameBusy(f"{path} holds the name of a node that is running: give each node a folder of its own")
        await asyncio.sleep(0.05)
    name = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not name:
        name = new_name()
        os.pwrite(fd, f"{name}\n".encode(), 0)
        os.fsync(fd)
    elif not VALID.fullmatch(name):
        os.close(fd)
        raise ValueError(f"{path / NAME_FILE}: {name!r} is not a node name (letters, digits, - _ = ., at most 100)")
    return name


def _locked(folder: Path) -> int | None:
    """The name file's descriptor, locked by this process; None while another holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / NAME_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
