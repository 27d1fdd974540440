"""A node's name kept across restarts and held by one live process (scaler/runtime/identity.py)."""

import asyncio
import signal
import sys

import pytest

from scaler.runtime.identity import NAME_FILE, NameBusy, claim_name

HOLD = "import asyncio, sys; from scaler.runtime.identity import claim_name; " \
       "print(asyncio.run(claim_name(sys.argv[1])), flush=True); sys.stdin.read()"  # fmt: skip


async def holder(folder) -> tuple[asyncio.subprocess.Process, str]:
    """Another process holding the name in `folder` until its stdin closes (or it is killed); and the name."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD, str(folder), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    return proc, (await proc.stdout.readline()).decode().strip()


async def test_the_name_is_kept_and_held_while_its_node_lives(tmp_path):
    first, name = await holder(tmp_path)
    try:
        assert name and (tmp_path / NAME_FILE).read_text().strip() == name
        with pytest.raises(NameBusy):
            await claim_name(tmp_path, wait_s=0.2)
    finally:
        first.send_signal(signal.SIGKILL)  # however it dies, the kernel lets the name go
        await first.communicate()  # its stdout read to the end too: the transport closes on this loop
    again, same = await holder(tmp_path)
    again.stdin.close()  # it lets the name go
    await again.communicate()  # and its stdout is read to the end: its transport closes on this loop
    assert same == name


async def test_a_start_waits_for_its_earlier_incarnation_to_finish_stopping(tmp_path):
    stopping, name = await holder(tmp_path)
    claiming = asyncio.create_task(claim_name(tmp_path, wait_s=30))
    await asyncio.sleep(0.3)
    assert not claiming.done()
    stopping.stdin.close()  # it lets the name go
    await stopping.communicate()  # and its stdout is read to the end: its transport closes on this loop
    assert await claiming == name


async def test_a_name_that_cannot_be_a_key_is_refused_with_the_file_named(tmp_path):
    (tmp_path / NAME_FILE).write_text("node one\n")
    with pytest.raises(ValueError, match="is not a node name"):
        await claim_name(tmp_path)
