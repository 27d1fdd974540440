"""Background tasks: stopping one for good, and saying where each one waits.

`task.cancel()` alone is not enough on Python 3.11: `asyncio.wait_for`, which nats-py's requests
use, swallows a cancellation that lands just as the future it waits on completes
(https://github.com/python/cpython/issues/86296), and a loop around such a request then goes on
as if nothing happened: a stop awaiting it waits forever (seen stopping a controller after a 1M-event
replay, its lease round mid-request). So the cancel is repeated until the task has ended.
"""

import asyncio
import io
import logging
from collections.abc import Iterator

log = logging.getLogger("scaler.tasks")

RECANCEL_S = 0.1


async def cancelled(*tasks: asyncio.Task | None) -> None:
    """Cancel the tasks (None: none) and return once each has ended, whatever it swallowed on the way."""
    while running := [task for task in tasks if task is not None and not task.done()]:
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=RECANCEL_S)


def say_where_tasks_wait() -> None:
    """Log every task of the running loop with the lines its coroutines wait on, outermost first (`kill -USR2`):
    what a process that has stopped making progress is stuck in, read off it while it runs, without a debugger."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    for task in tasks:
        out.write(f"--- {task.get_name()}\n")
        for line in _awaits(task.get_coro()):
            out.write(f"    {line}\n")
    log.warning("%d tasks, where each waits:\n%s", len(tasks), out.getvalue())


def awaited(coro) -> Iterator[object]:
    """The coroutine, then each one it awaits in turn, down to what the innermost awaits (a future, a generator): a
    task's own stack shows only its outermost coroutine."""
    while coro is not None:
        yield coro
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def _awaits(coro) -> Iterator[str]:
    """Each line of `awaited`, and what the innermost awaits."""
    for c in awaited(coro):
        frame = getattr(c, "cr_frame", None) or getattr(c, "gi_frame", None)
        if frame is None:  # finished, or not a coroutine: a future, an async generator's step
            yield f"awaits {c!r}"[:300]
            return
        yield f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
