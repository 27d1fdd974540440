"""The policy contract: what a policy decides, what it is told, what it declares; and the challenge's demo scaler.

A policy is built from its config (`Policy(config)`), a frozen struct of documented knobs; it declares its
capabilities (`Capability`), which the core asks through `Policy.can`; at each decision the core hands it
the run as that decision sees it (`RunView`, worked out once per decision); it answers with named results
(`KeepAlive`, `QueuePlan`, `Prewarm`). docs/policies.md, "Writing a policy", says the same for a user.
"""

import enum
import typing
from dataclasses import dataclass
from typing import Annotated, ClassVar

import msgspec

from scaler.controller.core.features import FnStats
from scaler.controller.core.open_gaps import NO_OPEN_GAPS, OpenGaps
from scaler.controller.core.state import FnState, Instance
from scaler.controller.core.totals import Totals


class Capability(enum.Flag):
    """How the core treats a policy's instances and arrivals, beyond the choices it asks the policy for."""

    NONE = 0
    # An instance started for a waiting request serves that request only (the challenge's Go starter: the
    # Assign that misses creates its own slot and waits for it, while an instance freed meanwhile goes idle
    # for the next arrival); without it, whoever waits longest takes whatever is ready first.
    DEDICATED_STARTS = enum.auto()
    # It learns which functions a function follows (comes back shortly after) and is cued when they come
    # back (scaler/controller/core/decide.py, "Leaders"): the node then shares the run's returns.
    FOLLOWS_LEADERS = enum.auto()


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A policy's knobs: each field `Annotated[type, msgspec.Meta(description=...)]`, unit in its name
    (`_ms`, `_s`) or its description, its default the policy as shipped (`knobs` lists them)."""


@dataclass(frozen=True)
class Knob:
    """One field of a policy's config, as `scaler sweep --vary` and `scaler simulate --knobs` show it."""

    name: str
    kind: type
    default: object
    doc: str


def knobs(config: type[PolicyConfig]) -> list[Knob]:
    """The config's fields, in order, with their types, defaults and descriptions."""
    hints = typing.get_type_hints(config, include_extras=True)
    out = []
    for f in msgspec.structs.fields(config):
        hint = hints[f.name]
        metas = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        kind = typing.get_args(hint)[0] if metas else hint
        out.append(Knob(f.name, kind, f.default, metas[0].description if metas else ""))
    return out


MIN_EXEC_MS = 1_000  # execution the run needs before the score's exchange rate is worked out from it
SPENT_SCORE = 3.0  # a resource score (of 50) below which the run's is spent: its rate is read at its own point
SPENT_SHARE = SPENT_SCORE / 50  # the execution's share of the slot time held, below which it is
SPENT_EXEC_MS = 60_000  # execution the run needs before its own resource score is taken as spent


@dataclass(frozen=True)
class RunView:
    """The whole run so far as one decision sees it: worked out once per decision from the run's `Totals`
    (`RunView.of`), the same for every choice the decision asks of the policy. `UNSEEN`: no run to go by."""

    # GB·s of slot time one second of waiting costs the score at the run's best reachable point
    # (`score_rate`); None until the run has executed MIN_EXEC_MS.
    exchange_rate: float | None = None
    # How soon the run's functions came back while new (`Totals.early_gaps`), and since when those not back
    # yet have been away (`Totals.early_open`).
    new_gaps: tuple[int, ...] = ()
    new_open: OpenGaps = NO_OPEN_GAPS

    @classmethod
    def of(cls, totals: Totals | None, now: int = 0) -> "RunView":
        if totals is None:
            return UNSEEN
        return cls(score_rate(totals, now), totals.early_gaps, totals.early_open)


UNSEEN = RunView()


def score_rate(t: Totals, now: int = 0) -> float | None:
    """GB·s of slot time that one second of waiting costs the score, at the run's best reachable point.

    score = 50 E_gb / S + 50 E / (E + W): d/dW = -50 E / (E + W)^2, d/dS = -50 E_gb / S^2, so a
    second of waiting is worth (E / (E + W)^2) / (E_gb / S^2) GB·s. Taken at the policy's own S and W, it
    feeds on itself (keep more, memory looks cheaper, keep more); so it is taken where a clairvoyant
    scaler would be on this workload: W = 0 and S = E_gb + the idle it could not avoid.

    Unless the run's own resource score, 50 E_gb / S, is spent (below SPENT_SCORE once it has executed
    SPENT_EXEC_MS): then more memory can cost the score little more whatever is done, where less waiting
    still counts in full, and the rate is taken at the run's own point (`gen-burst/0`, whose bursts
    no online scaler foresees as the clairvoyant does: docs/policies.md). Early in a run every
    resource score is low (its first starts, little executed yet), so not before SPENT_EXEC_MS.
    """
    if t.exec_ms < MIN_EXEC_MS or t.exec_gb_ms <= 0:
        return None
    e, e_gb = t.exec_ms / 1000, t.exec_gb_ms / 1000
    if t.exec_ms >= SPENT_EXEC_MS and (held := t.slot_gb_ms_at(now) / 1000) > e_gb / SPENT_SHARE:
        return e * held * held / (e_gb * (e + t.wait_ms / 1000) ** 2)
    slot = e_gb + t.ideal_gb_ms / 1000
    return slot * slot / (e * e_gb)


@dataclass(frozen=True)
class KeepAlive:
    until_ms: int
    why: str


@dataclass(frozen=True)
class QueuePlan:
    """For requests no idle instance or start covers: how many instances to start now.

    Those not started wait for an instance to free up; `recheck_ms` is when to reconsider if
    they still wait (None: only when something else happens). `ahead`: more instances to start now,
    for arrivals expected before those starts are ready (a burst that began with none ready).
    """

    starts: int
    ahead: int = 0
    why: str = "cold start: no idle instance"
    recheck_ms: int | None = None
    expected_ms: int = 0  # when a waiting request is expected to be served


@dataclass(frozen=True)
class Prewarm:
    """Instances to start now with no request waiting, and when the next planned start is due."""

    count: int = 0
    why: str = ""
    next_ms: int | None = None


NO_PREWARM = Prewarm()


class Policy:
    """The choices the core leaves open. Pure: the function's state `s`, its features `f` (what its events say of
    it: scaler/controller/core/features.py, folded beside the state), `now` and the run's view in, a named
    choice out.

    The core does the bookkeeping (queueing, matching, replies, expiry); a policy only says
    which idle instance to reuse, how many instances to start for waiting requests (or to let
    them wait), how long an idle instance stays, and when to start instances ahead of demand.
    Every choice comes with a reason, which goes into the events. A policy holds nothing but its
    config and name: the same object serves every decision of a run, and many runs.
    """

    name: str = "base"
    Config: ClassVar[type[PolicyConfig]] = PolicyConfig
    capabilities: ClassVar[Capability] = Capability.NONE

    def __init__(self, config: PolicyConfig | None = None, name: str | None = None) -> None:
        self.config = self.Config() if config is None else config
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{type(self).__name__} takes a {self.Config.__name__}, not {type(config).__name__}")
        if name is not None:
            self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r}, name={self.name!r})"

    def can(self, capability: Capability) -> bool:
        """Whether the policy declares `capability`: the one question the core and the shell ask of it."""
        return capability in self.capabilities

    def pick(self, s: FnState, f: FnStats, idle: list[Instance], now: int, run: RunView = UNSEEN) -> Instance:
        """The idle instance that serves the next waiting request: the most recently idled one."""
        return max(idle, key=lambda i: (i.since_ms, i.id))

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int, run: RunView = UNSEEN) -> QueuePlan:
        """`uncovered` requests wait with no idle instance and no start for them: start one each."""
        return QueuePlan(starts=uncovered)

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        """How long an instance that just became idle stays."""
        raise NotImplementedError

    def expire(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive | None:
        """An idle instance reached its deadline: keep it longer (a later deadline), or None to retire it."""
        return None

    def prewarm(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Prewarm:
        """Instances to start now with nothing waiting, and when to look again (`Prewarm.next_ms`)."""
        return NO_PREWARM


class FixedConfig(PolicyConfig, frozen=True, kw_only=True):
    keep_alive_ms: Annotated[int, msgspec.Meta(description="how long an idle instance stays, ms")] = 5 * 60_000


class FixedKeepAlive(Policy):
    """Reuse the most recently idled instance, cold-start on a miss, keep idle ones a fixed time."""

    name = "demo"
    Config = FixedConfig
    capabilities = Capability.DEDICATED_STARTS
    config: FixedConfig

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        keep = self.config.keep_alive_ms
        return KeepAlive(now + keep, f"fixed keep-alive {keep / 1000:g}s")
