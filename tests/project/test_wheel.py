"""Installing the scaler puts one import package, `scaler`, into site-packages, beside any other library.

The wheel is built from the sources (not an editable install) and installed into a fresh venv
next to proto-plus, whose top-level `proto` package a project of ours once shared a name with:
both must import, and the `scaler` command must run. The fresh venv borrows the test venv's
libraries through a path (a `.pth` line), so that only the two packages under test are installed.
"""

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from a copy of the sources (so the checkout gets no build/ folder)."""
    src, out = tmp_path_factory.mktemp("src") / "scaler", tmp_path_factory.mktemp("wheels")
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    pip(sys.executable, "wheel", "--no-deps", "--wheel-dir", str(out), str(src))
    (found,) = out.glob("scaler-*.whl")
    return found


def pip(python: str | Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def top_level(wheel: Path) -> set[str]:
    """The import names a wheel puts at the top of site-packages."""
    names = zipfile.ZipFile(wheel).namelist()
    return {n.split("/")[0].removesuffix(".py") for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}


def test_the_wheel_holds_one_top_level_package_and_the_command(wheel):
    assert top_level(wheel) == {"scaler"}
    with zipfile.ZipFile(wheel) as z:
        (entry_points,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert "scaler = scaler.cli:main" in z.read(entry_points).decode()
        assert "scaler/proto/serverless_sim.proto" in z.namelist(), "the .proto files ship with the generated code"


def test_installed_beside_proto_plus_both_import_and_the_command_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")  # our dependencies, not our code
    pip(python, "install", "--no-deps", str(wheel))
    pip(python, "install", "--no-deps", "proto-plus")

    both = "import proto, scaler.proto.serverless_sim_pb2; print(proto.Message.__module__, scaler.__file__)"
    message_module, scaler_file = run(python, "-c", both).split()
    assert message_module == "proto.message" and Path(scaler_file).is_relative_to(site)
    assert "simulate" in run(venv / "bin" / "scaler", "--help")

    pip(python, "uninstall", "-y", "proto-plus")  # it takes its own files, not ours
    run(python, "-c", "import scaler.cli")


def run(program: Path, *args: str) -> str:
    """What `program` prints, run outside the checkout (whose `scaler/` folder would shadow the installed one)."""
    done = subprocess.run([str(program), *args], capture_output=True, text=True, cwd=program.parents[2], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
