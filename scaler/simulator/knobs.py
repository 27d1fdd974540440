"""A policy's knobs, for `scaler sweep --vary`: for now the numeric fields of its dataclass.

The one place a knob is set (`with_knobs`), so that the policy contract, when it gives every policy a
documented config, replaces this module and nothing else.
"""

import dataclasses
import re

from scaler.controller.core.policy import Policy

NOT_KNOBS = {"name", "dedicated_starts", "follows_leaders"}  # what it is and how the core treats it, not tuning
UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h)?")


class KnobError(ValueError):
    """A knob the policy does not have, or a value it cannot take; said in one line."""


def knobs(policy: Policy) -> dict[str, type]:
    """The policy's knobs and their types: the int and float fields of its dataclass."""
    if not dataclasses.is_dataclass(policy):
        return {}
    found = {}
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if f.name not in NOT_KNOBS and type(value) in (int, float):
            found[f.name] = type(value)
        elif f.name not in NOT_KNOBS and value is None and f.type == float | None:  # unset until asked (exchange_rate)
            found[f.name] = float
    return found


def with_knobs(policy: Policy, settings: dict[str, str]) -> tuple[Policy, dict[str, int | float]]:
    """The policy with its knobs set from text (`keep_alive_ms` takes `90s`, `10min`), and the values set."""
    have = knobs(policy)
    values: dict[str, int | float] = {}
    for name, text in settings.items():
        if name not in have:
            which = ", ".join(sorted(have)) or "none"
            raise KnobError(f"policy {policy.name} has no knob {name!r} (its knobs: {which})")
        values[name] = _value(policy.name, name, have[name], text)
    return dataclasses.replace(policy, **values), values


def _value(policy: str, name: str, kind: type, text: str) -> int | float:
    m = DURATION.fullmatch(text.strip()) if name.endswith("_ms") else None
    try:
        if m is not None:
            value = float(m.group(1)) * UNITS_MS[m.group(2) or "ms"]
        else:
            value = float(text)
    except ValueError:
        unit = " (a number of ms, or with a unit: 90s, 10min, 1h)" if name.endswith("_ms") else ""
        raise KnobError(f"{policy}.{name}={text}: not a number{unit}") from None
    if value < 0 or value != value or value == float("inf"):
        raise KnobError(f"{policy}.{name}={text}: must be 0 or more")
    if kind is int:
        if value != int(value):
            raise KnobError(f"{policy}.{name}={text}: must be a whole number")
        return int(value)
    return value
