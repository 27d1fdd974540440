"""A background task is stopped for good, even when a cancellation is swallowed on the way (Python 3.11's
wait_for does that when its future completes as the cancel lands); where each task waits is said on demand."""

import asyncio
import logging

from scaler.runtime.tasks import cancelled, say_where_tasks_wait


async def swallowing_once(swallowed: list[bool]) -> None:
    """A loop like a lease round's: the first cancellation is swallowed (as wait_for does) and the loop goes on."""
    while True:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)


async def test_a_swallowed_cancellation_is_repeated_until_the_task_ends():
    swallowed: list[bool] = []
    task = asyncio.create_task(swallowing_once(swallowed))
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await cancelled(task)
    assert task.cancelled() and swallowed == [True]


async def test_several_tasks_are_stopped_together_whichever_swallows():
    swallowed: list[bool] = []
    tasks = [asyncio.create_task(swallowing_once(swallowed)), asyncio.create_task(asyncio.sleep(10))]
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await cancelled(tasks[0], None, tasks[1])
    assert all(t.cancelled() for t in tasks) and swallowed


async def test_nothing_to_stop_is_fine():
    await cancelled(None)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancelled(done)
    assert done.done() and not done.cancelled()


async def test_where_each_task_waits_is_logged_line_by_line(caplog):
    """What `kill -USR2` logs: every task, and the lines its coroutines wait on, down to the innermost."""

    async def loading(gate: asyncio.Event) -> None:
        await waiting_for_a_release(gate)

    async def waiting_for_a_release(gate: asyncio.Event) -> None:
        await gate.wait()

    gate = asyncio.Event()
    task = asyncio.create_task(loading(gate), name="load-partitions-0-15")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="scaler.tasks"):
        say_where_tasks_wait()
    gate.set()
    await task
    said = caplog.text
    assert "--- load-partitions-0-15" in said
    assert said.index(" in loading") < said.index(" in waiting_for_a_release"), said
    assert f"{__file__}:" in said
