"""The core must stay pure: no I/O, no clock, no randomness, so replay and simulation are exact."""

import ast
from pathlib import Path

import controller.core

FORBIDDEN = {"nats", "grpc", "asyncio", "time", "random", "uuid", "aiosqlite", "os", "socket", "datetime", "secrets"}
CORE = Path(controller.core.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_nothing_that_does_io():
    files = sorted(CORE.rglob("*.py"))
    assert files
    offenders = {str(f.relative_to(CORE)): imported_modules(f) & FORBIDDEN for f in files}
    assert {f: bad for f, bad in offenders.items() if bad} == {}


def test_the_check_would_catch_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom nats.aio import client\n")
    assert imported_modules(bad) == {"time", "nats"}
