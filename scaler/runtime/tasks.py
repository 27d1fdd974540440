"""Stopping a background task for good.

`task.cancel()` alone is not enough on Python 3.11: `asyncio.wait_for`, which nats-py's requests
use, swallows a cancellation that lands just as the future it waits on completes
(https://github.com/python/cpython/issues/86296), and a loop around such a request then goes on
as if nothing happened: a stop awaiting it waits forever (seen stopping a controller after a 1M-event
replay, its lease round mid-request). So the cancel is repeated until the task has ended.
"""

import asyncio

RECANCEL_S = 0.1


async def cancelled(task: asyncio.Task | None) -> None:
    """Cancel `task` and return once it has ended, whatever it swallowed on the way."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
