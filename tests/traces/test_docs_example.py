"""docs/traces.md's worked example, run as written in a fresh clone: an In-Vitro sample to a sweep page.

Its `sh` blocks run one after the other in one bash with `set -euo pipefail`, the venv activated (as the
README's install leaves it); the output the page pastes (its `text` blocks) must be what they print,
line for line, so the page cannot drift from what the commands do.
"""

import re
import subprocess
import sys
from pathlib import Path

from pytest_codeblocks import extract_from_file

from scaler.simulator.dataset import load_dataset
from tests.codeblocks import ROOT, fresh_clone, shell_blocks

TRACES = ROOT / "docs" / "traces.md"
EXAMPLE = "## A worked example: an In-Vitro sample to a sweep page"


def pasted_output() -> list[str]:
    """The lines of the `text` blocks of the example's section: what the page says the commands print."""
    lines = TRACES.read_text().splitlines()
    start = lines.index(EXAMPLE) + 1
    end = next(n for n in range(start, len(lines)) if lines[n].startswith("## "))
    blocks = [b.code for b in extract_from_file(TRACES) if b.syntax == "text" and start < b.lineno <= end]
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_worked_example_runs_as_written_and_prints_what_the_page_says(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    script = "\n".join(
        ["set -euo pipefail", f"source {Path(sys.prefix) / 'bin' / 'activate'}", *shell_blocks(TRACES, EXAMPLE)]
    )
    done = subprocess.run(["bash", "-c", script], cwd=clone, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    printed = done.stdout.splitlines()
    missing = [line for line in pasted_output() if line not in printed]
    assert not missing, "the page pastes lines the commands do not print:\n" + "\n".join(missing) + f"\n\n{done.stdout}"
    assert len(pasted_output()) >= 10  # the imports' lines and the sweep's table, not an empty block

    inits = sorted(m.init_duration_in_ms for m in load_dataset(clone / "az19").metas.values())
    assert len(set(inits)) == len(inits) == 8  # a spread: every function its own draw
    page = (clone / "az19.html").read_text()
    assert all(f"fixed10 keep_alive_ms={v}" in page for v in ("60 s", "5 min", "20 min"))  # its three points
    assert re.search(r"kept in runs\.sqlite \(sweep 'az19 [^']+'\); page az19\.html", done.stdout), done.stdout
