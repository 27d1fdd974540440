"""The tiers (tests/conftest.py): a test that reaches a process starter is never `fast`, and a fast test that
starts a process all the same fails, saying so."""

from pathlib import Path

import pytest

from tests import conftest

CONFTEST = Path(conftest.__file__)  # wherever this test lies

HELPERS = """
import subprocess

def start():
    subprocess.run(["true"])
"""

TESTS = """
import importlib

from tests_sample.helpers import start

def test_pure():
    assert sum([1, 2]) == 3

def test_through_a_helper():
    start()

def test_with_a_nats_server(nats_url):
    pass

def test_hidden_from_the_rule():
    importlib.import_module("subprocess").run(["true"])
"""


@pytest.fixture
def sample(pytester: pytest.Pytester) -> pytest.Pytester:
    """A suite of four tests under a copy of our conftest (a package named `tests...`, as the rule follows)."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    package = pytester.mkpydir("tests_sample")
    (package / "conftest.py").write_text(CONFTEST.read_text())
    (package / "helpers.py").write_text(HELPERS)
    (package / "test_sample.py").write_text(TESTS)
    return pytester


def tiered(sample: pytest.Pytester, marker: str) -> list[str]:
    found = sample.runpytest_inprocess("--collect-only", "-q", "-m", marker, "-p", "no:xdist", "-p", "no:randomly")
    return sorted(line.split("::")[1] for line in found.outlines if "::" in line)


def test_what_reaches_a_nats_server_or_a_subprocess_is_in_the_processes_tier(sample):
    assert tiered(sample, "fast") == ["test_hidden_from_the_rule", "test_pure"]
    assert tiered(sample, "processes") == ["test_through_a_helper", "test_with_a_nats_server"]


def test_a_fast_test_that_starts_a_process_fails_naming_the_rule(sample):
    ran = sample.runpytest_inprocess("-m", "fast", "-p", "no:xdist", "-p", "no:randomly")
    ran.assert_outcomes(passed=1, failed=1)
    ran.stdout.fnmatch_lines(["*test_hidden_from_the_rule is in the fast tier but started a process*STARTERS*"])
