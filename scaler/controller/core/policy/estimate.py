"""Estimates policies share: what the function's history says about the near future."""

from scaler.controller.core.features import UNKNOWN_START_MS, FnStats
from scaler.controller.core.state import FnState, Phase


def median(values: tuple[int, ...] | list[int]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return 0.0
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def start_ms(s: FnState, f: FnStats) -> int:
    """How long a new instance takes to be ready, as last observed."""
    return f.start_ms or UNKNOWN_START_MS


def expected_frees(s: FnState, f: FnStats, run_ms: float, now: int) -> list[float]:
    """When busy instances are expected to finish (those not already overdue), earliest first."""
    ends = [i.since_ms + run_ms for i in s.in_phase(Phase.BUSY)]
    return sorted(e for e in ends if e >= now)
