"""bench/live.py --against: a change measured in the same rounds as the code it changes, each run on its own code."""

import subprocess
import sys

import pytest

from bench import live as bench

WHERE = "import scaler; print(scaler.__file__)"
# What `scaler up` does: its parts are processes of their own, started from wherever it stands.
CHILD = (
    "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import scaler; print(scaler.__file__)'], cwd='/')"
)


def test_a_round_runs_each_node_scaler_then_itself_at_the_other_commit_and_always_the_durable_reference():
    assert bench.lineup(["node, demo"], "abc1234") == ["durable reference", "node, demo", "node, demo @ abc1234"]
    assert bench.lineup(list(bench.SCALERS), "") == list(bench.SCALERS)
    assert bench.lineup(["in-memory reference", "node, learned"], "abc1234") == [
        "in-memory reference",
        "durable reference",
        "node, learned",
        "node, learned @ abc1234",
    ]
    assert bench.base_name("node, learned @ abc1234") == "node, learned"


def test_the_other_commits_scaler_and_every_process_it_starts_import_that_checkouts_code(tmp_path):
    """A worktree of HEAD: a process started as bench/live.py starts a scaler from it (its folder, its environment),
    and one that process starts elsewhere, import `scaler` from the worktree, not from this checkout (where the
    installed package points). The worktree is gone after."""
    into = tmp_path / "against"
    with bench.worktree("HEAD", into) as commit:
        head = subprocess.run(["git", "-C", str(bench.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        assert commit == head
        env = bench.checkout_env(into)
        for code in (WHERE, CHILD):
            said = subprocess.run([sys.executable, "-c", code], cwd=into, env=env, capture_output=True, text=True)
            assert said.stdout.strip() == str(into / "scaler" / "__init__.py"), said
        here = subprocess.run([sys.executable, "-c", CHILD], cwd=bench.ROOT, capture_output=True, text=True)
        assert here.stdout.strip() == str(bench.ROOT / "scaler" / "__init__.py"), here
    assert not into.exists()


def test_a_revision_that_is_no_commit_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="--against no-such-rev"):
        with bench.worktree("no-such-rev", tmp_path / "against"):
            pass
    assert not (tmp_path / "against").exists()
