"""The components' clock, which a simulation may run faster than the wall clock.

At speed N every process maps wall time the same way, `anchor + (wall - anchor) * N`, so
timestamps from the controller, the gc worker and the platform stub agree without talking, and
stay monotonic across restarts. At speed 1 it is simply the wall clock in epoch milliseconds.
"""

import asyncio
import time
from dataclasses import dataclass

ANCHOR_MS = 1_672_531_200_000  # 2023-01-01T00:00:00Z


@dataclass(frozen=True)
class Clock:
    speed: float = 1.0

    def now_ms(self) -> int:
        wall = time.time() * 1000
        return int(ANCHOR_MS + (wall - ANCHOR_MS) * self.speed)

    def real_s(self, trace_ms: float) -> float:
        """Wall seconds that `trace_ms` of this clock's time take."""
        return max(trace_ms, 0) / 1000 / self.speed

    async def sleep_ms(self, trace_ms: float) -> None:
        await asyncio.sleep(self.real_s(trace_ms))
