"""How far a simulation is: a bar redrawn on a terminal, or a line every so often when stderr is a log.

Offline runs take a minute on the big traces and live ones hours: without this, nothing is said
until the end. On a terminal the bar is redrawn in place; otherwise (compose, a pipe, a file) one
line every `every_s` seconds, which a log keeps readable.
"""

import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 10.0  # between lines when stderr is not a terminal
REDRAW_S = 0.25  # between redraws of the bar
WIDTH = 30


class Progress:
    def __init__(
        self,
        total: int,
        span_ms: int,
        every_s: float = EVERY_S,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.span_ms = span_ms  # the trace's length, in trace time
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.every_s = REDRAW_S if self.tty else every_s
        self.clock = clock
        self.began = clock()
        self._next = self.began + self.every_s

    def due(self) -> bool:
        return self.clock() >= self._next

    def show(
        self,
        done: int,
        trace_ms: int,
        failed: int | None = None,
        in_flight: int | None = None,
        final: bool = False,
        tail: tuple[float, float] | None = None,
    ) -> None:
        """Say how far it is, if it is time to (or `final`: the bar's last state; no line in a log).

        `tail` (elapsed, length, ms of trace time): every request is done and the run goes on to its
        end, slots still charged; said as such rather than as trace time past the trace's end.
        """
        now = self.clock()
        if not final and now < self._next:
            return
        self._next = now + self.every_s
        counts = f"{done:,}/{self.total:,} requests"
        counts += f", in flight {in_flight:,}" if in_flight is not None else ""
        counts += f", failed {failed:,}" if failed is not None else ""
        if tail is not None:
            elapsed, length = tail
            trace = f"the run's end, {length / 1000:g}s after the last Idle: {_hms(elapsed)} of {_hms(length)}"
        else:
            trace = f"trace {_hms(min(trace_ms, self.span_ms))} of {_hms(self.span_ms)}"
        if self.tty:
            filled = WIDTH * done // max(self.total, 1)
            bar = f"[{'#' * filled}{'.' * (WIDTH - filled)}]"
            self.out.write(f"\r{bar} {counts}  {trace}" + ("\n" if final else "\x1b[K"))
        elif final:
            return
        else:
            share = 100 * done // max(self.total, 1)
            elapsed = _hms((now - self.began) * 1000)
            self.out.write(f"progress: {share}% {counts}, {trace}, {elapsed} elapsed\n")
        self.out.flush()


def _hms(ms: float) -> str:
    s = int(max(ms, 0)) // 1000
    return f"{s // 3600}:{s // 60 % 60:02}:{s % 60:02}"
