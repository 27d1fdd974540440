"""Policies by name, as `--policy NAME` selects them in `scaler up` and `scaler simulate`."""

from collections.abc import Callable

from controller.core.policy.base import FixedKeepAlive, KeepAlive, Policy

POLICIES: dict[str, Callable[[], Policy]] = {
    "demo": lambda: FixedKeepAlive(5 * 60_000, "demo"),
    "fixed10": lambda: FixedKeepAlive(10 * 60_000, "fixed10"),
}
DEFAULT_POLICY = "demo"


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = ["DEFAULT_POLICY", "POLICIES", "KeepAlive", "Policy", "get_policy"]
