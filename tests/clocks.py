"""Clocks for tests: the scaler's clock, standing still until the test moves it."""

from scaler.runtime.clock import ANCHOR_MS, Clock


class Stopped(Clock):
    """The scaler's clock, moving only when the test moves it."""

    def __init__(self, at_ms: int = ANCHOR_MS) -> None:
        object.__setattr__(self, "at", [at_ms])

    def now_ms(self) -> int:
        return self.at[0]

    def advance(self, ms: int) -> None:
        self.at[0] += ms
