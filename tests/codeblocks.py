"""A document's shell blocks run as written: the blocks under one heading, and a fresh clone to run them in.

The code blocks come out of the Markdown through pytest-codeblocks' parser. A clone holds only the
repository's tracked files and a `.venv` (the one these tests run in, standing for the README's install),
so a block that leans on something untracked fails here as it would for a newcomer.
"""

import subprocess
import sys
from pathlib import Path

from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[1]


def shell_blocks(markdown: Path, heading: str) -> list[str]:
    """The `sh` blocks of the section under `heading` (a whole line, `## ...`), in order."""
    lines = markdown.read_text().splitlines()
    start = lines.index(heading) + 1
    level = heading.split(" ")[0] + " "
    end = next((n for n in range(start, len(lines)) if lines[n].startswith(level)), len(lines))
    blocks = [b.code for b in extract_from_file(markdown) if b.syntax == "sh" and start < b.lineno <= end]
    assert blocks, f"no sh block under {heading!r} in {markdown}"
    return blocks


def fresh_clone(where: Path) -> Path:
    """The repository's tracked files (as a clone has them), and the venv of these tests as its `.venv`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            (where / name).write_bytes((ROOT / name).read_bytes())
    assert (Path(sys.prefix) / "bin" / "activate").exists(), "the tests run outside a venv"
    (where / ".venv").symlink_to(sys.prefix)
    return where
