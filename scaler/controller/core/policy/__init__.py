"""Policies by name, as `--policy NAME` selects them in `scaler up` and `scaler simulate`: each a class and
its default config (docs/policies.md, "Writing a policy").

The built-ins are here; names from outside the project (`package.module:Class`, the `scaler.policies`
entry points) are found by a `Finder` the process installs at its edge (scaler/controller/policies.py):
importing a user's module is I/O, which the core does not do itself.
"""

from typing import Protocol

from scaler.controller.core.policy.adaptive import PublicAdaptive
from scaler.controller.core.policy.base import (
    NO_PREWARM,
    UNSEEN,
    Capability,
    FixedConfig,
    FixedKeepAlive,
    KeepAlive,
    Policy,
    PolicyConfig,
    Prewarm,
    QueuePlan,
    RunView,
)
from scaler.controller.core.policy.cidre import Cidre
from scaler.controller.core.policy.histogram import HybridHistogram
from scaler.controller.core.policy.learned import Learned
from scaler.controller.core.policy.rainbowcake import RainbowCake
from scaler.controller.core.policy.spes import Spes

POLICIES: dict[str, tuple[type[Policy], PolicyConfig]] = {
    "demo": (FixedKeepAlive, FixedConfig(keep_alive_ms=5 * 60_000)),
    "fixed10": (FixedKeepAlive, FixedConfig(keep_alive_ms=10 * 60_000)),
    "histogram": (HybridHistogram, HybridHistogram.Config()),
    "public-adaptive": (PublicAdaptive, PublicAdaptive.Config()),
    "spes": (Spes, Spes.Config()),
    "rainbowcake": (RainbowCake, RainbowCake.Config()),
    "cidre": (Cidre, Cidre.Config()),
    "learned": (Learned, Learned.Config()),
}
DEFAULT_POLICY = "learned"


class Finder(Protocol):
    """Where names beyond the built-ins come from: a class and its default config, or ValueError saying why not."""

    def find(self, name: str) -> tuple[type[Policy], PolicyConfig]: ...

    def names(self) -> list[str]: ...


_finder: Finder | None = None


def use_finder(finder: Finder | None) -> None:
    """Let `get_policy` and the name checks reach policies from outside the project (None: built-ins only)."""
    global _finder
    _finder = finder


def policy_names() -> list[str]:
    """Every name this process can load without a module path: the built-ins, then the entry points."""
    return [*POLICIES, *(n for n in (_finder.names() if _finder else []) if n not in POLICIES)]


def _entry(name: str) -> tuple[type[Policy], PolicyConfig]:
    if name in POLICIES:
        return POLICIES[name]
    if _finder is not None:
        return _finder.find(name)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def get_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """The policy `name` (a built-in, an entry point or `package.module:Class`), with its default config or
    `config`; ValueError if this process cannot load it."""
    cls, default = _entry(name)
    return cls(default if config is None else config, name=name)


def policy_problem(name: str) -> str | None:
    """Why this process cannot load the policy `name` (one line), or None when it can."""
    try:
        _entry(name)
    except ValueError as e:
        return str(e)
    return None


__all__ = [
    "DEFAULT_POLICY",
    "NO_PREWARM",
    "POLICIES",
    "UNSEEN",
    "Capability",
    "Finder",
    "KeepAlive",
    "Policy",
    "PolicyConfig",
    "Prewarm",
    "QueuePlan",
    "RunView",
    "get_policy",
    "policy_names",
    "policy_problem",
    "use_finder",
]
