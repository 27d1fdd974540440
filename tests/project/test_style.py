"""Lint and format are part of the test command, so CI and a developer's run see the same thing."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    result = ruff("check", ".")
    assert result.returncode == 0, result.stdout


def test_ruff_format_is_clean():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout
