"""A policy's knobs set on the command line (`--knob NAME=VALUE`): the node's, `scaler up`'s and `scaler simulate`'s.

`scaler sweep` finds a knob's value worth running at (learned's `between_share` reaches peers' points no exchange
rate reaches alone: docs/policies.md); a node must be able to run at it.
"""

import pytest

from scaler.controller import __main__ as controller_main
from tests.processes import refused
from tests.simulator.test_simulate import gentle, simulate_cli


def node_args(monkeypatch, *argv: str, env: str | None = None):
    if env is not None:
        monkeypatch.setenv("SCALER_KNOBS", env)
    return controller_main.build_parser().parse_args(list(argv))


def test_the_nodes_policy_runs_with_the_knobs_given(monkeypatch):
    a = node_args(monkeypatch, "--knob", "between_share=0.01", "--knob", "memoryless_from=7", "--exchange-rate", "40")
    policy = controller_main.policy_of(a)
    assert policy.name == "learned"
    assert (policy.config.between_share, policy.config.memoryless_from, policy.config.exchange_rate) == (0.01, 7, 40)
    assert controller_main.policy_of(node_args(monkeypatch)).config == type(policy.config)()  # none: the defaults


def test_scaler_knobs_sets_them_when_no_knob_is_given_on_the_command_line(monkeypatch):
    from_env = controller_main.policy_of(node_args(monkeypatch, env="between_share=0.02 memoryless_from=9"))
    assert (from_env.config.between_share, from_env.config.memoryless_from) == (0.02, 9)
    given = controller_main.policy_of(node_args(monkeypatch, "--knob", "between_share=0.03", env="memoryless_from=9"))
    assert given.config.between_share == 0.03
    assert given.config.memoryless_from == type(given.config)().memoryless_from  # the flags alone, not the variable
    assert "[SCALER_KNOBS" in controller_main.build_parser().format_help().replace("\n", " ")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["up", "--knob", "nope=1"], "--knob: policy learned has no knob 'nope' (its knobs: "),
        (["up", "--knob", "between_share"], "argument --knob: expected NAME=VALUE (e.g. between_share=0.01)"),
        (["up", "--knob", "between_share=-1"], "--knob: learned.between_share=-1: must be 0 or more"),
        (["up", "--knob", "exchange_rate=30"], "--knob: exchange_rate is set with --exchange-rate"),
        (["up", "--policy", "demo", "--knob", "between_share=0.01"], "--knob: policy demo has no knob 'between_share'"),
    ],
)
def test_a_bad_knob_on_the_command_line_is_refused_in_one_line_before_anything_starts(args, why):
    _, line = refused(*args)
    assert why in line, line


def test_simulate_runs_the_policy_with_its_knobs(tmp_path, capsys):
    """demo keeps an idle instance 5 minutes; with `keep_alive_ms=1s` the same trace's instances go at once, and a
    later call of `a` that found one warm starts again."""
    trace = gentle(tmp_path)
    code, default, _ = simulate_cli(capsys, trace, "--offline", "--policy", "demo")
    assert code == 0
    code, short, _ = simulate_cli(capsys, trace, "--offline", "--policy", "demo", "--knob", "keep_alive_ms=1s")
    assert code == 0

    def cold_starts(out: str) -> int:
        return int(next(line for line in out.splitlines() if "coldStarts" in line).split()[-1])

    assert cold_starts(short) > cold_starts(default)
    code, _, err = simulate_cli(capsys, trace, "--offline", "--policy", "demo", "--knob", "keep_alive=1s")
    assert code == 1 and "--knob: policy demo has no knob 'keep_alive' (its knobs: keep_alive_ms)" in err
