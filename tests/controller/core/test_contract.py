"""The policy contract (docs/policies.md, "Writing a policy"): configs, capabilities, the run's view, results."""

import pytest

from scaler.controller.core.decide import decide
from scaler.controller.core.policy import POLICIES, UNSEEN, Capability, RunView, get_policy
from scaler.controller.core.policy.base import FixedKeepAlive, KeepAlive, knobs, score_rate
from scaler.controller.core.policy.learned import Learned, LearnedConfig
from scaler.controller.core.state import FnState
from scaler.controller.core.totals import Totals
from tests.controller.core.factories import KEY, assign, idle, ready, run

RUN = Totals(exec_ms=60_000, exec_gb_ms=30_000, ideal_gb_ms=90_000)  # a run whose exchange rate is known


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_knob_of_every_policy_is_documented_and_frozen(name):
    policy = get_policy(name)
    found = knobs(type(policy.config))
    assert found, name
    assert all(k.doc for k in found), [k.name for k in found if not k.doc]
    assert policy.config == POLICIES[name][1] and isinstance(policy.config, type(policy).Config)
    with pytest.raises(AttributeError):
        setattr(policy.config, found[0].name, 1)


def test_a_policy_is_built_from_its_config_and_refuses_another():
    fixed = get_policy("fixed10")
    assert (type(fixed), fixed.config.keep_alive_ms, fixed.name) == (FixedKeepAlive, 600_000, "fixed10")
    assert Learned().config == LearnedConfig() and Learned().name == "learned"
    with pytest.raises(TypeError, match="Learned takes a LearnedConfig, not FixedConfig"):
        Learned(fixed.config)


def test_capabilities_are_declared_by_the_class_and_asked_through_can():
    learned, demo = get_policy("learned"), get_policy("demo")
    assert learned.can(Capability.FOLLOWS_LEADERS) and not learned.can(Capability.DEDICATED_STARTS)
    assert demo.can(Capability.DEDICATED_STARTS) and not demo.can(Capability.FOLLOWS_LEADERS)
    assert not any(get_policy(p).can(Capability.FOLLOWS_LEADERS) for p in POLICIES if p != "learned")


class Spy(FixedKeepAlive):
    """The demo's choices, keeping the view each policy call was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[RunView] = []

    def plan_queue(self, s, f, uncovered, now, run=UNSEEN):
        self.seen.append(run)
        return super().plan_queue(s, f, uncovered, now, run)

    def keep_alive(self, s, f, inst, now, run=UNSEEN) -> KeepAlive:
        self.seen.append(run)
        return super().keep_alive(s, f, inst, now, run)

    def prewarm(self, s, f, now, run=UNSEEN):
        self.seen.append(run)
        return super().prewarm(s, f, now, run)


def test_one_decision_hands_every_policy_call_one_view_of_the_run():
    spy = Spy()
    d = decide(FnState(key=KEY), assign("r1"), 1_000, spy, RUN)
    s, _ = run(ready(), at=1_100, s=d.state)
    spy.seen.clear()
    decide(s, idle("r1"), 2_000, spy, RUN)  # the instance goes idle: keep-alive, then pre-warm
    assert len(spy.seen) >= 2 and all(v is spy.seen[0] for v in spy.seen)
    assert spy.seen[0].exchange_rate == score_rate(RUN) and spy.seen[0].new_gaps == RUN.early_gaps
    spy.seen.clear()
    decide(s, idle("r1"), 2_000, spy)  # no run given: the view of no run
    assert spy.seen and all(v is UNSEEN for v in spy.seen)


def test_learned_values_waiting_at_the_runs_rate_unless_its_config_fixes_one():
    view = RunView.of(RUN)
    assert Learned().wait_gb(UNSEEN) == 5.0  # nothing to go by: the config's wait_gb
    assert Learned().wait_gb(view) == pytest.approx(score_rate(RUN)) != 5.0
    assert Learned(LearnedConfig(exchange_rate=42.0)).wait_gb(view) == 42.0
    assert Learned(LearnedConfig(max_wait_gb=1.0)).wait_gb(view) == 1.0  # the learned rate is bounded
