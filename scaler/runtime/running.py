"""Where a running `scaler up` says how to reach it, so that `scaler replay` finds it without being told.

One small JSON file per run (`up-<pid>.json`: its NATS URL, gRPC address, data dir) in the user's
runtime folder: `$XDG_RUNTIME_DIR/scaler/`, else `<tmp>/scaler-<uid>/`. Written once the scaler is
ready, removed when it stops; a file left by a `scaler up` that was killed names a process that
is gone, and is removed by the next reader.
"""

import json
import os
import tempfile
from pathlib import Path


def folder() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        return Path(base) / "scaler"
    return Path(tempfile.gettempdir()) / f"scaler-{os.getuid()}"


def record(info: dict[str, str]) -> Path:
    """Say that this process runs a scaler reachable as `info`; returns the file to remove at exit."""
    where = folder()
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = where / f"up-{os.getpid()}.json"
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({**info, "pid": os.getpid()}))
    partial.replace(path)  # a reader sees the whole file or none
    return path


def forget(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running() -> list[dict]:
    """The records of the `scaler up`s running now, oldest first; stale ones are removed."""
    found = []
    for path in sorted(folder().glob("up-*.json"), key=lambda p: p.stat().st_mtime):
        try:
            info = json.loads(path.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            found.append(info)
        else:
            path.unlink(missing_ok=True)
    return found
