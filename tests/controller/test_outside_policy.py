"""A policy from outside the project: `--policy package.module:Class` and the `scaler.policies` entry points,
loaded by the docs' example (docs/examples/my_policy.py) offline and live, and every way a name can fail."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaler.controller import policies
from scaler.controller.core.limits import FunctionLimits, Limits, limits_problem
from scaler.controller.core.policy import Policy
from scaler.controller.ledger import _loaded_or
from scaler.controller.policies import get_policy, policy_names, policy_problem
from scaler.proto import commands as c
from scaler.proto import events as e
from scaler.simulator.dataset import load_dataset
from scaler.simulator.offline import simulate
from tests.controller.test_seeds_ledger import Node, idle, operator, served
from tests.live_run import simulate_live
from tests.simulator.test_simulate import gentle

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
SMOKE = ROOT / "tests" / "fixtures" / "function_smoke_test"
SPEC = "my_policy:EqualIdleMemory"


@pytest.fixture
def outside(monkeypatch, tmp_path):
    """This process able to load outside policies, with docs/examples and a scratch folder on its path."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    policies._outside._found.clear()
    for name in [m for m in sys.modules if m in {"my_policy", "broken", "shapes_of"}]:
        del sys.modules[name]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(EXAMPLES), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "scaler", *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_the_docs_example_runs_offline_from_outside_the_package(tmp_path, outside):
    done = run_cli("simulate", str(SMOKE), "--offline", "--policy", SPEC, "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr
    assert f"offline, policy {SPEC}" in done.stdout
    stats = json.loads((tmp_path / "out.json").read_text())
    # the example decided the run: its figures are the in-process run's of the same class, not the default's
    dataset = load_dataset(SMOKE)
    mine = simulate(dataset, get_policy(SPEC)).stats()
    theirs = simulate(dataset, get_policy("demo")).stats()
    assert (stats["totalRequestsCount"], stats["failedRequestsCount"]) == (980, 0)
    assert stats["coldStarts"] == mine.cold_starts
    assert stats["totalSlotTimeInGBs"] == pytest.approx(mine.total_slot_time_in_g_bs)
    assert stats["totalSlotTimeInGBs"] != pytest.approx(theirs.total_slot_time_in_g_bs, rel=0.01)


def test_an_outside_policy_is_named_as_it_was_given(outside):
    made = get_policy(SPEC)
    assert isinstance(made, Policy) and made.name == SPEC  # what a node's status and heartbeat say
    inst = type("I", (), {"memory_mb": 128})()
    assert made.config.budget_gb_s == 60.0
    assert made.keep_alive(None, None, inst, 1_000).until_ms == 1_000 + 480_000  # 60 GB·s over 1/8 GB


BROKEN = """
from scaler.controller.core.policy import Policy

class NotOne:
    pass

class Fails(Policy):
    def __init__(self, config=None, name=None):
        raise RuntimeError("no knobs file")

def makes_a_string():
    return "learned"

value = 3
"""


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("nowhere_at_all:P", "policy 'nowhere_at_all:P': no module named 'nowhere_at_all' (is it on PYTHONPATH?)"),
        ("broken:Missing", "policy 'broken:Missing': broken has no attribute 'Missing'"),
        ("broken:NotOne", "policy 'broken:NotOne': NotOne is not a Policy (make it a subclass of"),
        ("broken:value", "policy 'broken:value': not a Policy class but int"),
        ("broken:Fails", "policy 'broken:Fails': its constructor failed: RuntimeError: no knobs file"),
        ("broken:makes_a_string", "policy 'broken:makes_a_string': not a Policy class but function"),
        ("shapes_of:P", "policy 'shapes_of:P': importing shapes_of failed: ModuleNotFoundError: No module named"),
        ("broken:", "policy 'broken:': give it as package.module:Class"),
        ("nothing-like-it", "unknown policy 'nothing-like-it'; choose one of demo, fixed10,"),
    ],
)
def test_a_name_that_cannot_load_is_said_in_one_line(outside, spec, said):
    (outside / "broken.py").write_text(BROKEN)
    (outside / "shapes_of.py").write_text("import a_library_not_installed\n")
    with pytest.raises(argparse.ArgumentTypeError) as e:
        policies.checked(spec)
    assert str(e.value).startswith(said) and "\n" not in str(e.value), str(e.value)
    assert policy_problem(spec) == str(e.value)  # the same said for a limits file's names


def test_the_command_line_refuses_a_name_it_cannot_load(tmp_path):
    done = run_cli("simulate", str(SMOKE), "--offline", "--policy", "my_policy:Nope")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        "argument --policy: policy 'my_policy:Nope': my_policy has no attribute 'Nope'"
    ), done.stderr


def test_a_limits_file_takes_an_outside_name_the_node_can_load(outside):
    good, bad = (Limits(functions={"f": FunctionLimits(policy=name)}) for name in (SPEC, "my_policy:Nope"))
    assert limits_problem(good) is None is policies.limits_problem(good)
    assert limits_problem(bad) is None  # the core checks the form; the node's edge, whether it imports
    said = policies.limits_problem(bad)
    assert said == "functions.f.policy: policy 'my_policy:Nope': my_policy has no attribute 'Nope'"
    said = limits_problem(Limits(functions={"f": FunctionLimits(policy="bogus")}))
    assert said.startswith("functions.f.policy: unknown policy 'bogus'; choose one of demo,")


def test_a_node_that_cannot_load_a_functions_policy_decides_with_its_own(outside, caplog):
    own = get_policy("demo")
    assert _loaded_or("gone_module:P", own) is own
    assert "policy 'gone_module:P': no module named 'gone_module'" in caplog.text
    assert _loaded_or(SPEC, own).name == SPEC


def test_an_entry_point_joins_the_built_in_names(outside):
    dist = outside / "their_policies-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: their-policies\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[scaler.policies]\nequal-idle = {SPEC}\nbad = my_policy:Nope\n")
    assert {"learned", "equal-idle", "bad"} <= set(policy_names())
    made = get_policy("equal-idle")
    assert type(made).__name__ == "EqualIdleMemory" and made.name == "equal-idle"
    assert policy_problem("bad") == (
        "policy 'bad' (entry point my_policy:Nope): cannot load: AttributeError: module 'my_policy' has no attribute"
        " 'Nope'"
    )
    assert "equal-idle" in policies.choices()


@pytest.mark.live_trace
async def test_the_docs_example_runs_live_under_scaler_up(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))  # the node `scaler up` starts imports it too
    run = await simulate_live(gentle(tmp_path / "g"), tmp_path / "up", SPEC, "--json", str(tmp_path / "out.json"))
    assert f"policy {SPEC}," in run.up_lines[-1]
    assert f"policy {SPEC}" in run.out  # the running scaler said which policy it runs
    stats = json.loads((tmp_path / "out.json").read_text())
    assert (stats["totalRequestsCount"], stats["failedRequestsCount"]) == (6, 0)


def test_an_operator_sets_an_outside_policy_and_a_node_that_cannot_import_it_uses_its_own(outside, caplog):
    node = Node()
    i = served(node, "a", 0)
    said = operator(node, c.Configure(key="fn", policy=SPEC, reason="try it"), 5)
    assert said.message == f"policy {SPEC}" and node.s().policy == SPEC
    node(idle("a", i), 10)
    assert node.of(e.KeptAlive)[-1].why.startswith("equal idle memory: 60 GB·s over")
    refused = operator(node, c.Configure(key="fn", policy="bogus"), 20)
    assert refused.code is c.Code.INVALID_ARGUMENT and node.s().policy == SPEC  # not a name's form: nothing stored
    # the core takes any package.module:Class (it imports nothing): one this node cannot import is logged and the
    # function decided by the node's own policy (demo), not left unserved
    assert operator(node, c.Configure(key="fn", policy="my_policy:Nope"), 30).code is c.Code.OK
    j = served(node, "b", 40)
    node(idle("b", j), 50)
    assert node.of(e.KeptAlive)[-1].why == "fixed keep-alive 300s"
    assert "policy 'my_policy:Nope': my_policy has no attribute 'Nope'" in caplog.text


def test_a_sweep_moves_an_outside_policys_knob_in_its_workers(tmp_path):
    # run from a folder of its own, the module on PYTHONPATH: each worker process imports it too
    args = ("sweep", str(SMOKE), "--policy", SPEC, "--vary", "budget_gb_s=30,120", "--jobs", "2")
    done = run_cli(*args, "--db", str(tmp_path / "runs.sqlite"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[1]: line.split() for line in done.stdout.splitlines() if line.startswith(SPEC)}
    assert set(rows) == {"budget_gb_s=30", "budget_gb_s=120"}
    wasted = {k: float(row[3].replace(",", "")) for k, row in rows.items()}
    assert wasted["budget_gb_s=30"] < wasted["budget_gb_s=120"]  # the knob reached the policy in the worker
