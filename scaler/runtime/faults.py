"""A fault that may last (a platform gone away): said once when it starts, then ever more rarely, and when it ends.

A lasting fault repeated in the log every few seconds buries everything else and says nothing new.
The first occurrence is logged in full; repeats are counted and summed up after a minute, then
two, four ... at most once an hour; the first success after them is one line too.
"""

import logging
import time
from collections.abc import Callable

FIRST_GAP_S = 60.0
LONGEST_GAP_S = 3600.0


class LastingFault:
    def __init__(
        self,
        log: logging.Logger,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.ERROR,
    ) -> None:
        self.log = log
        self.what = what  # who fails, for the lines that sum up: "gc worker"
        self.clock = clock
        self.level = level  # of the lines while it fails (WARNING: an outage of something else, ridden out)
        self.count = 0  # occurrences since it began
        self._since = 0.0
        self._unsaid = 0  # occurrences not yet summed up
        self._next = 0.0
        self._gap = FIRST_GAP_S

    def occurred(self, message: str) -> None:
        now = self.clock()
        self.count += 1
        if self.count == 1:
            self._since, self._next, self._gap = now, now + FIRST_GAP_S, FIRST_GAP_S
            self.log.log(self.level, "%s", message)
            return
        self._unsaid += 1
        if now >= self._next:
            self.log.log(
                self.level,
                "%s: %d more failures in the last %s, still failing; the latest: %s",
                self.what, self._unsaid, _span(self._gap), message,
            )  # fmt: skip
            self._unsaid = 0
            self._gap = min(self._gap * 2, LONGEST_GAP_S)
            self._next = now + self._gap

    def ended(self) -> None:
        if self.count:
            self.log.warning(
                "%s: working again after %d failures over %s", self.what, self.count, _span(self.clock() - self._since)
            )
        self.count = self._unsaid = 0


def _span(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} min"
