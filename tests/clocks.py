"""Clocks for tests, standing still until the test moves them: the scaler's clock, and a monotonic one."""

from scaler.runtime.clock import ANCHOR_MS, Clock


class Stopped(Clock):
    """The scaler's clock, moving only when the test moves it."""

    def __init__(self, at_ms: int = ANCHOR_MS) -> None:
        object.__setattr__(self, "at", [at_ms])

    def now_ms(self) -> int:
        return self.at[0]

    def advance(self, ms: int) -> None:
        self.at[0] += ms


class Monotonic:
    """A monotonic clock in seconds (as `time.monotonic`, which Admission takes), moving only when told."""

    def __init__(self, at_s: float = 100.0) -> None:
        self.now = at_s

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s
