"""Each function's next deadline (keep-alive expiry, a planned pre-warm, a lease), fired as a Tick when due.

The ledger says when each function wants to be woken; this keeps one timer for all of them. A
deadline replaced before it is due is skipped when its turn comes. The Tick is decided like any
command, so an Assign that raced the timer still wins the instance it would have retired.
"""

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable

from scaler.runtime.clock import Clock
from scaler.runtime.faults import LastingFault
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.controller.path.timers")


class Timers:
    def __init__(self, clock: Clock, fire: Callable[[str, int], Awaitable[object]]) -> None:
        self.clock = clock
        self.fire = fire  # called with the function and the deadline that came due
        self.due: dict[str, int] = {}  # function -> its deadline (clock ms)
        self._heap: list[tuple[int, str]] = []
        self._changed = asyncio.Event()
        self._firing: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        # The event store away, or the partitions not decided here for a while: one line, not one per tick a second
        self._failing = LastingFault(log, "ticks", level=logging.WARNING)
        self._failed: set[str] = set()  # functions whose last tick failed: working again once none is left

    def set(self, key: str, wake_ms: int | None) -> None:
        if wake_ms is None:
            self.due.pop(key, None)
            self._failed.discard(key)
            return
        if self.due.get(key) == wake_ms:
            return
        self.due[key] = wake_ms
        heapq.heappush(self._heap, (wake_ms, key))
        if self._heap[0] == (wake_ms, key):
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)
        if self._firing:
            await asyncio.wait(self._firing, timeout=10)

    async def _run(self) -> None:
        while True:
            now = self.clock.now_ms()
            while self._heap and self._heap[0][0] <= now:
                due, key = heapq.heappop(self._heap)
                if self.due.get(key) == due:  # else replaced by a later decision
                    del self.due[key]
                    task = asyncio.create_task(self._fire(key, due))
                    self._firing.add(task)
                    task.add_done_callback(self._firing.discard)
            self._changed.clear()
            wait = self.clock.real_s(self._heap[0][0] - now) if self._heap else None
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                pass

    async def _fire(self, key: str, due: int) -> None:
        try:
            await self.fire(key, due)
        except Exception as e:  # the event store is away: try again soon rather than never
            self._failed.add(key)
            self._failing.occurred(f"tick for {key} failed ({e}); each failed tick is tried again every 1s")
            await asyncio.sleep(1)
            if key not in self.due:  # nothing newer was decided meanwhile
                self.set(key, due)
            return
        self._failed.discard(key)
        if not self._failed:
            self._failing.ended()
