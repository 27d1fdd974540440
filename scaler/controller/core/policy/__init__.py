"""Policies by name, as `--policy NAME` selects them in `scaler up` and `scaler simulate`."""

from collections.abc import Callable

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


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = ["DEFAULT_POLICY", "NO_PREWARM", "POLICIES", "KeepAlive", "Policy", "Prewarm", "QueuePlan", "get_policy"]
