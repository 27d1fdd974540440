"""Learned's exchange rate (slot GB·s a second of waiting is worth) as a setting: the node's, and a function's own."""

import random
from itertools import accumulate

import pytest

from scaler.controller.__main__ import limits_file, load_limits
from scaler.controller.core.limits import FunctionLimits, Limits
from scaler.controller.core.policy import get_policy
from scaler.controller.core.policy.base import RunView
from scaler.controller.core.policy.learned import MAX_RATE, MIN_RATE, rate_problem, with_rate
from scaler.controller.knobs import KnobError, with_knobs
from scaler.simulator.dataset import Dataset, FunctionMeta, Request
from scaler.simulator.offline import Simulation
from tests.processes import refused
from tests.simulator.test_simulate import gentle, simulate_cli


def dataset(keys: tuple[str, ...]) -> Dataset:
    """Calls with irregular gaps of 5 to 120 s: whether to keep an instance through one is a real trade."""
    rng = random.Random(7)
    metas = {k: FunctionMeta(key=k, memory_in_mb=1024, init_duration_in_ms=500) for k in keys}
    requests = []
    for k in keys:
        t = 0
        for _ in range(80):
            t += rng.choice((5_000, 20_000, 60_000, 120_000))
            requests.append(Request(start_time=t, meta_key=k, durations_in_ms=200))
    return Dataset("t", metas, sorted(requests, key=lambda r: r.start_time))


def per_function(sim: Simulation, end: int) -> dict[str, tuple[int, float]]:
    """Each function's cold starts and slot GB·s."""
    run = sim.result(end)
    colds: dict[str, int] = {}
    for i in run.invocations:
        colds[i.key] = colds.get(i.key, 0) + i.cold
    return {k: (colds[k], run.slot_gb_s_by_key[k]) for k in colds}


def simulate(ds: Dataset, policy, limits: Limits | None = None) -> Simulation:
    sim = Simulation(ds, policy)
    if limits is not None:
        for ledger in sim.ledgers:
            ledger.limits = limits
    sim.run()
    return sim


def end_of(ds: Dataset) -> int:
    return max(r.start_time for r in ds.requests) + 1_000


def test_a_high_rate_gives_fewer_cold_starts_and_more_idle_memory_than_a_low_one():
    ds = dataset(("fn",))
    learned = get_policy("learned")
    low = per_function(simulate(ds, with_rate(learned, MIN_RATE)), end_of(ds))["fn"]
    high = per_function(simulate(ds, with_rate(learned, MAX_RATE)), end_of(ds))["fn"]
    assert high[0] < low[0], (low, high)
    assert high[1] > low[1], (low, high)


def test_a_functions_own_rate_in_the_limits_file_changes_that_function_only():
    ds = dataset(("a", "b"))
    learned = with_rate(get_policy("learned"), MIN_RATE)
    alike = per_function(simulate(ds, learned), end_of(ds))
    own = Limits(functions={"a": FunctionLimits(exchange_rate=MAX_RATE)})
    rated = per_function(simulate(ds, learned, own), end_of(ds))
    assert rated["b"] == alike["b"]  # b decides at the node's rate, as before
    assert rated["a"][0] < alike["a"][0] and rated["a"][1] > alike["a"][1]  # a at its own: it keeps more


def test_a_policy_without_an_exchange_rate_refuses_one():
    with pytest.raises(ValueError, match="fixed10 has no exchange rate"):
        with_rate(get_policy("fixed10"), 5.0)
    fixed10 = get_policy("fixed10")
    assert with_rate(fixed10, None) is fixed10


def test_the_rate_is_a_sweep_knob():
    policy, values = with_knobs(get_policy("learned"), {"exchange_rate": "20"})
    assert policy.config.exchange_rate == 20.0 and values == {"exchange_rate": 20.0}
    with pytest.raises(KnobError, match="not a number"):
        with_knobs(get_policy("learned"), {"exchange_rate": "lots"})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"functions": {"f": {"exchange_rate": 0}}}', "functions.f.exchange_rate: an exchange rate is 0.1 to "),
        ('{"default": {"exchange_rate": 5e6}}', "default.exchange_rate: an exchange rate is 0.1 to 1,000,000"),
        ('{"default": {"exchange_rate": "high"}}', "Expected `float | null`"),
    ],
)
def test_a_bad_rate_in_the_limits_file_is_refused_with_where_it_is(tmp_path, text, why):
    path = tmp_path / "limits.json"
    path.write_text(text)
    with pytest.raises(Exception, match=why.replace("|", r"\|")):
        limits_file(str(path))


def test_a_good_rate_in_the_limits_file_is_read(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text('{"functions": {"f": {"exchange_rate": 40}}}')
    assert load_limits(str(path)).of("f").exchange_rate == 40.0
    assert load_limits(str(path)).of("g").exchange_rate is None


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["up", "--exchange-rate", "0"], "argument --exchange-rate: an exchange rate is 0.1 to 1,000,000"),
        (["up", "--exchange-rate", "cheap"], "argument --exchange-rate: not a number: 'cheap'"),
        (["up", "--exchange-rate", "nan"], "argument --exchange-rate: an exchange rate is 0.1 to 1,000,000"),
        (["simulate", "x", "--exchange-rate", "2e6"], "argument --exchange-rate: an exchange rate is 0.1 to 1,000,000"),
        (["up", "--policy", "fixed10", "--exchange-rate", "5"], "--exchange-rate: policy fixed10 has no exchange rate"),
    ],
)
def test_a_bad_rate_on_the_command_line_is_refused_in_one_line(args, why):
    _, line = refused(*args)
    assert why in line, line


def test_simulate_takes_the_rate_for_learned_and_refuses_it_for_a_policy_without_one(tmp_path, capsys):
    trace = gentle(tmp_path)
    code, out, _ = simulate_cli(capsys, trace, "--offline", "--exchange-rate", "50")
    assert code == 0 and "score" in out
    code, _, err = simulate_cli(capsys, trace, "--offline", "--policy", "fixed10", "--exchange-rate", "5")
    assert code == 1 and "--exchange-rate: policy fixed10 has no exchange rate" in err


def test_a_rate_above_what_a_run_teaches_may_be_set_and_is_used_as_set():
    """An operator may value waiting above the most a run can teach (max_wait_gb, the clamp of the default's
    learned rate): the setting is taken as it is, while the learned rate stays clamped."""
    learned = get_policy("learned")
    high = 40 * learned.config.max_wait_gb
    assert rate_problem(high) is None
    assert with_rate(learned, high).wait_gb(RunView()) == high
    assert rate_problem(MAX_RATE * 2) is not None
    # A start of 110 ms and lulls of 200-600 s: at 1000 GB·s a second a miss (110 GB·s) costs less than
    # holding 1 GB through a lull; at 40 times that it costs more.
    rng = random.Random(7)
    metas = {"fn": FunctionMeta(key="fn", memory_in_mb=1024, init_duration_in_ms=10)}
    starts = list(accumulate(rng.choice((200_000, 400_000, 600_000)) for _ in range(30)))
    ds = Dataset("t", metas, [Request(start_time=t, meta_key="fn", durations_in_ms=200) for t in starts])
    top = per_function(simulate(ds, with_rate(learned, learned.config.max_wait_gb)), end_of(ds))["fn"]
    higher = per_function(simulate(ds, with_rate(learned, high)), end_of(ds))["fn"]
    assert higher[0] < top[0] and higher[1] > top[1], (top, higher)
