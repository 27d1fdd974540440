"""Policies by name, as `--policy NAME` selects them in `scaler up` and `scaler simulate`: each a class and
its default config (docs/policies.md, "Writing a policy")."""

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


def get_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """The policy `name`, with its default config or `config`."""
    try:
        cls, default = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return cls(default if config is None else config, name=name)


__all__ = [
    "DEFAULT_POLICY",
    "NO_PREWARM",
    "POLICIES",
    "UNSEEN",
    "Capability",
    "KeepAlive",
    "Policy",
    "PolicyConfig",
    "Prewarm",
    "QueuePlan",
    "RunView",
    "get_policy",
]
