"""A background task is stopped for good, even when a cancellation is swallowed on the way (Python 3.11's
wait_for does that when its future completes as the cancel lands)."""

import asyncio

from scaler.runtime.tasks import cancelled


async def test_a_swallowed_cancellation_is_repeated_until_the_task_ends():
    swallowed = 0

    async def lease_round_like() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # as wait_for does: the loop goes on

    task = asyncio.create_task(lease_round_like())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await cancelled(task)
    assert task.cancelled() and swallowed == 1


async def test_nothing_to_stop_is_fine():
    await cancelled(None)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancelled(done)
    assert done.done() and not done.cancelled()
