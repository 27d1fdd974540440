"""Shared fixtures, and the tiers: every test is `fast`, `slow` or `processes`, decided here and nowhere else.

`processes`: the code the test runs from tests/ (its body, the fixtures it uses, the test helpers they call,
followed name by name) names something that starts a process: a nats-server (`NatsServer`, `NatsCluster`),
`subprocess`, asyncio's subprocess calls; or the scaler's own code starts one for it (THROUGH_THE_SCALER).
`slow`: no process, but whole traces simulated offline (WHOLE_TRACES). `fast`: the rest, about a minute in
all on two cores (`pytest -m fast`). A fast test that starts a process fails at once, so the tier stays true.
"""

import inspect
import subprocess
import types
from collections.abc import Iterator

import pytest

from scaler.platform_stub.server import PlatformStub
from scaler.runtime.natsd import NatsServer

# What starts a process, as a test's code names it: a global or an attribute.
STARTERS = frozenset(
    {"NatsServer", "NatsCluster", "subprocess", "create_subprocess_exec", "create_subprocess_shell", "Popen"}
)
# Tests whose processes the scaler's own code starts, out of sight of the names above.
THROUGH_THE_SCALER = {
    "tests/simulator/test_runs.py": "a saved run records its commit (`git describe`)",
    "tests/simulator/test_sweep.py::test_a_sweep_runs_its_points_in_processes": "a sweep runs its points in processes",
    "tests/simulator/test_bench_probe.py::test_a_probed_run_stamps_every_call_between_its_sending_and_its_answer": (
        "bench/live.py starts the reference scaler"
    ),
    "tests/simulator/test_bench_against.py::test_a_revision_that_is_no_commit": "bench/live.py asks git for the commit",
    "tests/simulator/test_bench_lean.py": "bench/live.py starts the lean node and its nats-server",
}


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _functions_of(obj: object) -> list[types.FunctionType]:
    """The Python functions behind a test, a fixture or a helper class from tests/ (its methods)."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, type):
        return [f for v in vars(obj).values() for f in _functions_of(getattr(v, "__func__", v))]
    return []


def _starts_a_process(roots: list[object], seen: set[int]) -> str:
    """The name of the first process starter reached from `roots` through code in tests/, or ''."""
    todo = [f for root in roots for f in _functions_of(root)]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for code in _code_objects(fn.__code__):
            for name in code.co_names:
                if name in STARTERS:
                    return f"{fn.__module__}.{fn.__qualname__} names {name}"
                value = fn.__globals__.get(name)
                if (getattr(value, "__module__", None) or "").startswith("tests"):
                    todo += _functions_of(value)
    return ""


# Tests that start no process but simulate whole traces offline, seconds each: the `slow` tier.
WHOLE_TRACES = (
    "tests/system/test_nodes.py::test_sharing_the_totals_gives_the_scores_of_one_node",
    "tests/simulator/test_shapes.py::test_no_policy_executes_more_than_it_holds_slots_for",
    "tests/simulator/test_simulate.py::test_offline_runs_the_five_hour_trace",
)


def tier(item: pytest.Function) -> pytest.MarkDecorator:
    fixtures = [
        d.func
        for name, defs in item._fixtureinfo.name2fixturedefs.items()
        for d in defs
        if name != "_fast_starts_nothing"  # the guard names subprocess to refuse it
    ]
    if item.nodeid.startswith(tuple(THROUGH_THE_SCALER)) or _starts_a_process([item.function, *fixtures], set()):
        return pytest.mark.processes
    if item.nodeid.startswith(WHOLE_TRACES):
        return pytest.mark.slow
    return pytest.mark.fast


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # The README's code blocks (pytest-codeblocks) are no functions of ours: they run commands.
        item.add_marker(tier(item) if isinstance(item, pytest.Function) else pytest.mark.processes)


@pytest.fixture(autouse=True)
def _fast_starts_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `fast` test that starts a process fails, so that the tier stays what it says."""
    if request.node.get_closest_marker("fast") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} is in the fast tier but started a process ({args[1:2]}): "
            "teach tests/conftest.py's STARTERS the name it is started by (or THROUGH_THE_SCALER the test)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server with JetStream, fresh for each test, its store in the test's temp dir."""
    async with NatsServer(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
async def stub():
    """The platform stub, as the scaler's own tests use it (a slot per CreateSlot, 20 ms to make one)."""
    platform = PlatformStub("127.0.0.1:0", create_latency_ms=20)
    await platform.start()
    yield platform
    await platform.stop()


@pytest.fixture
async def challenge_stub():
    """The platform stub as the challenge's platform behaves: a new slot per CreateSlot, no list of its slots."""
    platform = PlatformStub("127.0.0.1:0", create_latency_ms=20, like_challenge=True)
    await platform.start()
    yield platform
    await platform.stop()
