"""Policies by name, as `--policy NAME` selects them in `scaler up` and `scaler simulate`.

The built-ins are here; names from outside the project (`package.module:Class`, the `scaler.policies`
entry points) are found by a `Finder` the process installs at its edge (scaler/controller/policies.py):
importing a user's module is I/O, which the core does not do itself.
"""

from collections.abc import Callable
from typing import Protocol

from scaler.controller.core.policy.adaptive import PublicAdaptive
from scaler.controller.core.policy.base import NO_PREWARM, FixedKeepAlive, KeepAlive, Policy, Prewarm, QueuePlan
from scaler.controller.core.policy.cidre import Cidre
from scaler.controller.core.policy.histogram import HybridHistogram
from scaler.controller.core.policy.learned import Learned
from scaler.controller.core.policy.rainbowcake import RainbowCake
from scaler.controller.core.policy.spes import Spes

POLICIES: dict[str, Callable[[], Policy]] = {
    "demo": lambda: FixedKeepAlive(5 * 60_000, "demo"),
    "fixed10": lambda: FixedKeepAlive(10 * 60_000, "fixed10"),
    "histogram": HybridHistogram,
    "public-adaptive": PublicAdaptive,
    "spes": Spes,
    "rainbowcake": RainbowCake,
    "cidre": Cidre,
    "learned": Learned,
}
DEFAULT_POLICY = "learned"


class Finder(Protocol):
    """Where names beyond the built-ins come from: a factory by name, or ValueError saying why not."""

    def find(self, name: str) -> Callable[[], Policy]: ...

    def names(self) -> list[str]: ...


_finder: Finder | None = None


def use_finder(finder: Finder | None) -> None:
    """Let `get_policy` and the name checks reach policies from outside the project (None: built-ins only)."""
    global _finder
    _finder = finder


def policy_names() -> list[str]:
    """Every name this process can load without a module path: the built-ins, then the entry points."""
    return [*POLICIES, *(n for n in (_finder.names() if _finder else []) if n not in POLICIES)]


def _factory(name: str) -> Callable[[], Policy]:
    if name in POLICIES:
        return POLICIES[name]
    if _finder is not None:
        return _finder.find(name)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def get_policy(name: str) -> Policy:
    """A new policy by its name: a built-in, an entry point or `package.module:Class`; ValueError if none."""
    return _factory(name)()


def policy_problem(name: str) -> str | None:
    """Why this process cannot load the policy `name` (one line), or None when it can."""
    try:
        _factory(name)
    except ValueError as e:
        return str(e)
    return None


__all__ = [
    "DEFAULT_POLICY",
    "NO_PREWARM",
    "POLICIES",
    "Finder",
    "KeepAlive",
    "Policy",
    "Prewarm",
    "QueuePlan",
    "get_policy",
    "policy_names",
    "policy_problem",
    "use_finder",
]
