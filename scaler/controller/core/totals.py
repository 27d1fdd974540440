"""The whole run so far, summed over functions (`Totals`): what the score is made of, the instances held now,
how soon new functions come back and which came back lately.

It reads both folds of each function, its lifecycle (scaler/controller/core/state.py) and its features
(scaler/controller/core/features.py), so it lives above both.
"""

import msgspec

from scaler.controller.core.features import EARLY_GAPS, FOLLOW_MS, GAP_BINS, NO_STATS, FnStats, gap_bin
from scaler.controller.core.open_gaps import ACTIVE_MS, NO_OPEN_GAPS, RESTED_MS, Opened, OpenGaps
from scaler.controller.core.state import NOTHING_HELD, FnState, Held, Instance, held
from scaler.proto.events import Lead

RETURNS_KEPT = 64  # the run's latest returns from a lull, at most (Totals.returns)


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """The whole run so far, summed over functions: what the score is made of, and the instances held
    now (what caps over all functions count). A value: `change` makes a new one."""

    exec_ms: float = 0.0
    exec_gb_ms: float = 0.0
    wait_ms: float = 0.0
    ideal_gb_ms: float = 0.0
    instances: int = 0  # every instance in a state, retiring ones too (they hold a slot until destroyed)
    memory_mb: int = 0
    # How soon functions come back while they are new: every function's first gaps (FnStats.early_gaps)
    # by gap bin, and when the early gaps still open began (a function's last arrival, while it is one of
    # its first EARLY_GAPS), by coarse start: those have lasted at least until now.
    early_gaps: tuple[int, ...] = (0,) * GAP_BINS
    early_open: OpenGaps = NO_OPEN_GAPS
    # The functions that came back from a lull lately (FnStats.returned_ms, within FOLLOW_MS of the newest),
    # oldest first: those a function coming back now came shortly after are the ones it may follow.
    returns: tuple[tuple[str, int], ...] = ()
    tenants: dict[str, Held] = {}  # by tenant: the instances of its functions (only functions with a tenant)
    # The slot time of the instances gone (FnState.slot_gb_ms), and the GB of those alive x their wanted_ms, summed
    # (GB·ms): with `memory_mb`, `slot_gb_ms_at` counts the live ones up to any time.
    slot_gb_ms: float = 0.0
    slot_since: float = 0.0

    def slot_gb_ms_at(self, now: int) -> float:
        """The slot time the run's instances held up to `now`, as the score counts it (FnState's, summed)."""
        return self.slot_gb_ms + (self.memory_mb * now) / 1024 - self.slot_since

    def plus(self, other: "Totals") -> "Totals":
        """The run's totals from two sets of functions (another node's partitions, say)."""
        return Totals(
            exec_ms=self.exec_ms + other.exec_ms,
            exec_gb_ms=self.exec_gb_ms + other.exec_gb_ms,
            wait_ms=self.wait_ms + other.wait_ms,
            ideal_gb_ms=self.ideal_gb_ms + other.ideal_gb_ms,
            instances=self.instances + other.instances,
            memory_mb=self.memory_mb + other.memory_mb,
            early_gaps=tuple(a + b for a, b in zip(self.early_gaps, other.early_gaps, strict=True)),
            early_open=self.early_open.plus(other.early_open),
            returns=newest_returns([*self.returns, *other.returns]),
            tenants=_summed(self.tenants, other.tenants) if other.tenants else self.tenants,
            slot_gb_ms=self.slot_gb_ms + other.slot_gb_ms,
            slot_since=self.slot_since + other.slot_since,
        )

    def held(self, tenant: str) -> Held:
        return self.tenants.get(tenant, NOTHING_HELD)

    def change(
        self, old: FnState | None, new: FnState | None, was: FnStats | None = None, now: FnStats | None = None
    ) -> "Totals":
        """The totals once one function's state `old` (its features `was`) is replaced by `new` (its features
        `now`); None: no state, or none learned."""
        was = was or NO_STATS
        now = now or NO_STATS
        early = self.early_gaps
        if was.early_gaps != now.early_gaps:
            counts = list(early)
            for gap in was.early_gaps:
                counts[gap_bin(gap)] -= 1
            for gap in now.early_gaps:
                counts[gap_bin(gap)] += 1
            early = tuple(counts)
        before = old.instances if old is not None else {}
        after = new.instances if new is not None else {}
        memory, since = _held_change(before, after)
        return Totals(
            exec_ms=self.exec_ms - was.exec_ms + now.exec_ms,
            exec_gb_ms=self.exec_gb_ms - was.exec_gb_ms + now.exec_gb_ms,
            wait_ms=self.wait_ms - was.wait_ms + now.wait_ms,
            ideal_gb_ms=self.ideal_gb_ms - was.ideal_gb_ms + now.ideal_gb_ms,
            instances=self.instances - len(before) + len(after),
            memory_mb=self.memory_mb + memory,
            early_gaps=early,
            early_open=_still_open(self.early_open, old, new, was, now),
            returns=_returned(self.returns, old, new, was, now),
            tenants=_tenants(self.tenants, old, new) if (old and old.tenant) or (new and new.tenant) else self.tenants,
            slot_gb_ms=self.slot_gb_ms - (old.slot_gb_ms if old else 0.0) + (new.slot_gb_ms if new else 0.0),
            slot_since=self.slot_since + since,
        )

    def with_returns(self, returns: tuple[tuple[str, int], ...]) -> "Totals":
        """These totals, with other functions' returns heard of besides (Ledger.hear)."""
        return msgspec.structs.replace(self, returns=newest_returns([*self.returns, *returns]))

    def leads(self, key: str, now: int) -> tuple[Lead, ...]:
        """The other functions that came back within FOLLOW_MS before `now`, each with how long before (its latest
        return)."""
        latest: dict[str, int] = {}
        for other, at in self.returns:
            if other != key and 0 <= now - at <= FOLLOW_MS:
                latest[other] = at
        return tuple(Lead(key=other, lag_ms=now - at) for other, at in latest.items())


def _returned(
    returns: tuple[tuple[str, int], ...], old: FnState | None, new: FnState | None, was: FnStats, now: FnStats
):
    """The recent returns, once one function's state `old` becomes `new` (None: no state): each function's latest,
    those within FOLLOW_MS of the newest, at most RETURNS_KEPT of them; the same whatever order the functions
    change in, as the other totals are."""
    back = was.returned_ms if old is not None else 0
    back_now = now.returned_ms if new is not None else 0
    if back == back_now:
        return returns
    key = new.key if new is not None else old.key
    kept = [r for r in returns if r[0] != key]
    return newest_returns([*kept, (key, back_now)] if back_now else kept)


def newest_returns(returns: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """Each function's latest return, those within FOLLOW_MS of the newest, at most RETURNS_KEPT, oldest first."""
    if not returns:
        return ()
    latest: dict[str, int] = {}
    for key, at in returns:
        latest[key] = max(at, latest.get(key, at))
    newest = max(latest.values())
    within = sorted(((k, at) for k, at in latest.items() if newest - at <= FOLLOW_MS), key=lambda r: (r[1], r[0]))
    return tuple(within[-RETURNS_KEPT:])


def _summed(a: dict[str, Held], b: dict[str, Held]) -> dict[str, Held]:
    return {t: a.get(t, NOTHING_HELD).plus(b.get(t, NOTHING_HELD)) for t in a.keys() | b.keys()}


def _tenants(tenants: dict[str, Held], old: FnState | None, new: FnState | None) -> dict[str, Held]:
    """The tenants' instances, once one function's state `old` becomes `new` (the same map when no tenant's
    count changed: functions without a tenant cost nothing here)."""
    was = (old.tenant, held(old)) if old is not None and old.tenant else ("", NOTHING_HELD)
    now = (new.tenant, held(new)) if new is not None and new.tenant else ("", NOTHING_HELD)
    if was == now:
        return tenants
    out = dict(tenants)
    if was[0]:
        out[was[0]] = out.get(was[0], NOTHING_HELD).plus(was[1], -1)
    if now[0]:
        out[now[0]] = out.get(now[0], NOTHING_HELD).plus(now[1])
    return {t: h for t, h in out.items() if h != NOTHING_HELD}


def _held(instances: dict[str, Instance]) -> tuple[int, float]:
    """The instances' memory (MB), and its GB x their wanted_ms: where FnState.slot_gb_ms_at counts their slot time
    from."""
    if not instances:
        return 0, 0.0
    memory = sum(i.memory_mb for i in instances.values())
    return memory, sum(i.memory_mb * i.wanted_ms for i in instances.values()) / 1024


def _held_change(before: dict[str, Instance], after: dict[str, Instance]) -> tuple[int, float]:
    """What `_held` says more once `before` become `after`. An instance's memory and wanted_ms are fixed when it is
    started, but for a ClockRebased, which moves every wanted_ms alike: the same instances, one's wanted_ms unmoved,
    hold the same, so most decisions (an assignment, a release: a phase changed) sum a function's dozens of
    instances for nothing."""
    if before is after or (not before and not after):
        return 0, 0.0
    if before.keys() == after.keys():
        some = next(iter(before))
        if before[some].wanted_ms == after[some].wanted_ms:
            return 0, 0.0
        return 0, _held(after)[1] - _held(before)[1]  # rebased: the same memory, moved
    (memory, since), (memory_after, since_after) = _held(before), _held(after)
    return memory_after - memory, since_after - since


def _still_open(opened: OpenGaps, old: FnState | None, new: FnState | None, was: FnStats, now: FnStats) -> OpenGaps:
    """The early gaps still open, once one function's state `old` becomes `new`."""
    before, after = _open_gap(old, was), _open_gap(new, now)
    if before == after:
        return opened
    if before is not None:
        opened = opened.add(before, -1)
    return opened.add(after) if after is not None else opened


def _open_gap(s: FnState | None, st: FnStats) -> Opened | None:
    """Where the function's early gap still open is counted, if it has one."""
    if s is None or not 0 < st.arrivals <= EARLY_GAPS:
        return None
    t = st.last_arrival_ms
    return Opened(True, t // RESTED_MS) if s.rested else Opened(False, t // ACTIVE_MS)
