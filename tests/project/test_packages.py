"""Packages point one way: proto, runtime, controller core, services, tools.

A module imports from its own package and from the layers below it, never from a layer above
nor from another service beside it (a node's gateway and controller meet in `runtime`, not in
each other). Read from the sources, imports inside functions included.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS = {
    "scaler.proto": 0,
    "scaler.runtime": 1,
    "scaler.store": 2,
    "scaler.controller.core": 2,
    "scaler.controller": 3,
    "scaler.gateway": 3,
    "scaler.workers": 3,
    "scaler.platform_stub": 4,
    "scaler.simulator": 4,
    "scaler.report": 4,
    "scaler.replay": 4,
    "scaler.traces": 4,
    "scaler.cli": 4,
    "scaler.__main__": 4,
    "bench": 4,
    "scripts": 4,
    "tests": 4,
}
TOOLS = 4  # tools may use one another (the simulator drives the stub, the stub reads traces)


def package(module: str) -> str | None:
    """The package of LAYERS a dotted module name belongs to (the longest match), or None for a library."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if (name := ".".join(parts[:n])) in LAYERS:
            return name
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def offence(importer: str, imported: str) -> str | None:
    """Why `importer`'s package may not import `imported`'s, or None when it may."""
    if importer == imported:
        return None
    low, high = LAYERS[imported], LAYERS[importer]
    if low > high:
        return "points up"
    if low == high and high != TOOLS:
        return "points sideways"
    return None


def offences(root: Path = ROOT) -> list[str]:
    found = []
    for top in {name.split(".")[0] for name in LAYERS}:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            importer = package(".".join(rel.with_suffix("").parts))
            if importer is None:
                continue
            for line, name in imports(path):
                imported = package(name)
                if imported is not None and (why := offence(importer, imported)):
                    found.append(f"{rel}:{line}: {importer} imports {name}: {why}")
    return found


def test_packages_point_one_way():
    assert offences() == []


@pytest.mark.parametrize(
    "importer, imported, why",
    [
        ("scaler.controller", "scaler.gateway", "points sideways"),
        ("scaler.workers", "scaler.controller", "points sideways"),
        ("scaler.runtime", "scaler.controller", "points up"),
        ("scaler.runtime", "scaler.controller.core", "points up"),
        ("scaler.proto", "scaler.runtime", "points up"),
        ("scaler.controller", "scaler.controller.core", None),
        ("scaler.controller.core", "scaler.controller", "points up"),
        ("scaler.cli", "scaler.gateway", None),
        ("scaler.simulator", "scaler.platform_stub", None),
    ],
)
def test_the_rule(importer, imported, why):
    assert offence(importer, imported) == why


def test_a_sideways_import_is_found(tmp_path):
    (tmp_path / "scaler" / "workers").mkdir(parents=True)
    (tmp_path / "scaler" / "workers" / "w.py").write_text("def f():\n    from scaler.controller import stream\n")
    assert offences(tmp_path) == [
        "scaler/workers/w.py:2: scaler.workers imports scaler.controller.stream: points sideways"
    ]


CORE = ROOT / "scaler" / "controller" / "core"


def run_time_imports(path: Path) -> set[str]:
    """The modules a file imports when it runs: those under `if TYPE_CHECKING:` (types alone) left out."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def test_the_lifecycle_and_the_features_fold_stand_apart():
    """Issue 42: the lifecycle state (state.py) knows nothing of the features (features.py), which read it only as
    the arguments of their fold; what reads both (totals.py, folds.py, the policies) stands above them."""
    core = "scaler.controller.core."
    lifecycle, learned = run_time_imports(CORE / "state.py"), run_time_imports(CORE / "features.py")
    assert not {m for m in lifecycle if m.startswith(core) and not m.startswith(core + "state")}, lifecycle
    assert not {m for m in learned if m.startswith(core + "state")}, learned


def test_a_run_time_import_of_the_lifecycle_by_the_features_is_found(tmp_path):
    (tmp_path / "features.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from a import b\n"
        "from scaler.controller.core.state import FnState\n"
    )
    assert run_time_imports(tmp_path / "features.py") == {
        "typing.TYPE_CHECKING",
        "scaler.controller.core.state.FnState",
    }
