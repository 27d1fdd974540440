"""A policy's knobs, for a node's and `scaler simulate`'s `--knob` and `scaler sweep --vary` and `--knobs`: the
fields of its config (`PolicyConfig`).

The one place a knob is read from text and set (`with_knobs`): a config's numeric fields, with their
descriptions (`policy.base.knobs`), so a knob is documented where it is defined.
"""

import argparse
import re
import types
import typing

import msgspec

from scaler.controller.core.policy import Policy
from scaler.controller.core.policy.base import Knob
from scaler.controller.core.policy.base import knobs as config_knobs
from scaler.controller.core.policy.learned import with_rate

UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h)?")


class KnobError(ValueError):
    """A knob the policy does not have, or a value it cannot take; said in one line."""


def _number(kind: object) -> type | None:
    """int or float for a field of that type (or of it or None), else None: not a knob a sweep sets."""
    if kind in (int, float):
        return kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        numbers = [k for k in typing.get_args(kind) if k is not type(None)]
        return numbers[0] if len(numbers) == 1 and numbers[0] in (int, float) else None
    return None


def described(policy: Policy) -> list[Knob]:
    """Every knob of the policy's config, with its type, default and description."""
    return config_knobs(type(policy.config))


def knobs(policy: Policy) -> dict[str, type]:
    """The policy's knobs a sweep can set and their types: the int and float fields of its config."""
    return {k.name: kind for k in described(policy) if (kind := _number(k.kind)) is not None}


def with_knobs(policy: Policy, settings: dict[str, str]) -> tuple[Policy, dict[str, int | float]]:
    """The policy with its knobs set from text (`keep_alive_ms` takes `90s`, `10min`), and the values set."""
    have = knobs(policy)
    values: dict[str, int | float] = {}
    for name, text in settings.items():
        if name not in have:
            which = ", ".join(sorted(have)) or "none"
            raise KnobError(f"policy {policy.name} has no knob {name!r} (its knobs: {which})")
        values[name] = _value(policy.name, name, have[name], text)
    config = msgspec.structs.replace(policy.config, **values)
    return type(policy)(config, name=policy.name), values


def listing(policy: Policy) -> str:
    """The policy's knobs as lines: name, value as the policy has it, description (`scaler sweep --knobs`)."""
    rows = [(k.name, repr(getattr(policy.config, k.name)), k.doc) for k in described(policy)]
    if not rows:
        return f"{policy.name}: no knobs"
    width = max(len(n) for n, _, _ in rows), max(len(d) for _, d, _ in rows)
    lines = [f"{policy.name}:"]
    lines += [f"  {n:<{width[0]}}  {d:>{width[1]}}  {doc}" for n, d, doc in rows]
    return "\n".join(lines)


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


def knob_arg(text: str) -> tuple[str, str]:
    """An argparse type: `--knob NAME=VALUE`, checked against the policy once the policy is known (`with_knobs`)."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. between_share=0.01), got {text!r}")
    return name.strip(), value.strip()


def tuned(policy: Policy, rate: float | None, knobs: list[tuple[str, str]]) -> Policy:
    """The policy with the knobs (`--knob`) and the exchange rate (`--exchange-rate`, which checks learned's bounds)
    asked for; KnobError naming the flag for a knob the policy lacks, a value it cannot take, or an exchange rate
    of a policy without one."""
    if any(name == "exchange_rate" for name, _ in knobs):
        raise KnobError("--knob: exchange_rate is set with --exchange-rate, which checks its bounds")
    try:
        policy, _ = with_knobs(policy, dict(knobs))
    except KnobError as e:
        raise KnobError(f"--knob: {e}") from None
    try:
        return with_rate(policy, rate)
    except ValueError as e:
        raise KnobError(f"--exchange-rate: {e}") from None
