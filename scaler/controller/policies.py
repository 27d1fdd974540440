"""Policies from outside the project: `package.module:Class` and the `scaler.policies` entry points.

The core knows its built-ins by name and checks only the form of any other (`package.module:Class`); this
module, at the process's edge, imports what a user names and hands the core a built policy. A name travels between
nodes as it was given (a function's policy is an event holding its name), so each node must be able to
import it: the module on its PYTHONPATH (or in its working directory), or the package that declares the
entry point installed.
"""

import argparse
import importlib
import importlib.metadata
import os
import sys

from scaler.controller.core import policy as core_policy
from scaler.controller.core.limits import Limits
from scaler.controller.core.policy import Policy, PolicyConfig
from scaler.controller.core.policy.learned import rate_problem

GROUP = "scaler.policies"


class Outside:
    """The core's `Finder`: entry points by name, `module:Class` by import; each found once, kept."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[type[Policy], PolicyConfig]] = {}

    def names(self) -> list[str]:
        return sorted({ep.name for ep in importlib.metadata.entry_points(group=GROUP)})

    def find(self, name: str) -> tuple[type[Policy], PolicyConfig]:
        if name not in self._found:
            self._found[name] = self._load(name)
        return self._found[name]

    def _load(self, name: str) -> tuple[type[Policy], PolicyConfig]:
        if ":" in name:
            target = _import(name)
        elif eps := importlib.metadata.entry_points(group=GROUP, name=name):
            ep = next(iter(eps))
            try:
                target = ep.load()
            except Exception as e:  # whatever the user's import raises is said, in one line
                raise ValueError(f"policy {name!r} (entry point {ep.value}): cannot load: {_said(e)}") from None
        else:
            known = ", ".join(policy_names())
            raise ValueError(f"unknown policy {name!r}; choose one of {known}, or give package.module:Class")
        return _checked(name, target)


def _import(spec: str) -> object:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy {spec!r}: give it as package.module:Class")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would: a module beside you is found, after installed ones
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):  # not one it imports
            raise ValueError(f"policy {spec!r}: no module named {e.name!r} (is it on PYTHONPATH?)") from None
        raise ValueError(f"policy {spec!r}: importing {module_name} failed: {_said(e)}") from None
    except Exception as e:
        raise ValueError(f"policy {spec!r}: importing {module_name} failed: {_said(e)}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"policy {spec!r}: {module_name} has no attribute {attr!r}") from None
    return target


def _checked(name: str, target: object) -> tuple[type[Policy], PolicyConfig]:
    """`target` as the core keeps a policy (its class and default config), once it is known to build."""
    if not isinstance(target, type):
        raise ValueError(f"policy {name!r}: not a Policy class but {type(target).__name__}")
    if not issubclass(target, Policy):
        base = "scaler.controller.core.policy.Policy"
        raise ValueError(f"policy {name!r}: {target.__qualname__} is not a Policy (make it a subclass of {base})")
    try:
        config = target.Config()
        target(config, name=name)  # a constructor that fails says so here, at the door, not in a decision
    except Exception as e:
        raise ValueError(f"policy {name!r}: its constructor failed: {_said(e)}") from None
    return target, config


def _said(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]


_outside = Outside()


def policy_names() -> list[str]:
    """Every name this process can load without a module path: the built-ins, then the entry points."""
    return [*core_policy.POLICIES, *(n for n in _outside.names() if n not in core_policy.POLICIES)]


def get_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """The policy `name` (a built-in, an entry point or `package.module:Class`), with its default config or
    `config`; ValueError saying why in one line if this process cannot load it."""
    cls, default = core_policy.POLICIES.get(name) or _outside.find(name)
    return cls(default if config is None else config, name=name)


def policy_problem(name: str) -> str | None:
    """Why this process cannot load the policy `name` (one line), or None when it can."""
    try:
        core_policy.POLICIES.get(name) or _outside.find(name)
    except ValueError as e:
        return str(e)
    return None


def choices() -> str:
    """The names a `--policy` takes, for its help."""
    return f"one of {', '.join(policy_names())}, or package.module:Class"


def checked(name: str) -> str:
    """An argparse type: a policy name this process can load (one line saying why not, else)."""
    if problem := policy_problem(name):
        raise argparse.ArgumentTypeError(problem)
    return name


def limits_problem(limits: Limits) -> str | None:
    """A policy a limits file names that this node cannot import, said with where it is; None if none."""
    named = [("default", limits.default), *((f"functions.{k}", f) for k, f in limits.functions.items())]
    for where, f in named:
        if f.policy and (problem := policy_problem(f.policy)):
            return f"{where}.policy: {problem}"
    return None


def rate_arg(text: str) -> float:
    """An argparse type: an exchange rate (`--exchange-rate`), refused when out of learned's bounds."""
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if problem := rate_problem(rate):
        raise argparse.ArgumentTypeError(problem)
    return rate
