"""The fault suite's power-cut disk (tests/powercut.py), on a real FUSE mount: a cut drops what was not synced and
keeps what was, and nats-server's acknowledged messages survive one only when it syncs them."""

import os
from pathlib import Path

import nats
import pytest

from scaler.runtime.natsd import NatsServer
from tests.powercut import PowerCutDisk


@pytest.fixture
async def disk(tmp_path):
    async with PowerCutDisk(tmp_path / "disk", tmp_path / "mount") as d:
        yield d


async def test_a_cut_keeps_what_was_synced_and_drops_the_rest(disk):
    m = disk.mount
    written = write_some_synced_some_not(m)
    assert written == {"log": 12004, "never-synced": 4, "renamed": 3, "cut-short": 5001}

    await disk.cut()
    await disk.start()

    after = {p.name: p.stat().st_size for p in m.iterdir() if p.is_file()}
    assert after == {"log": 12000, "never-synced": 0, "renamed": 0, "cut-short": 9000}  # names kept, as LazyFS does
    assert (m / "log").read_bytes() == b"kept" * 3000
    assert (m / "cut-short").read_bytes() == b"a" * 9000
    assert (m / "dir").is_dir()


def write_some_synced_some_not(m: Path) -> dict[str, int]:
    """Files written, some of their data synced; their sizes as the mount shows them before a cut."""
    with open(m / "log", "wb") as f:
        f.write(b"kept" * 3000)  # three pages and some
        os.fsync(f.fileno())
        f.write(b"lost")  # after the sync
    (m / "never-synced").write_bytes(b"gone")
    with open(m / "renamed.tmp", "wb") as f:
        f.write(b"new")
    os.rename(m / "renamed.tmp", m / "renamed")  # the classic: a rename with no sync of the data before it
    fd = os.open(m / "cut-short", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"a" * 9000)
    os.fsync(fd)
    os.ftruncate(fd, 100)
    os.pwrite(fd, b"b", 5000)
    assert os.pread(fd, 8, 4993) == b"\0" * 7 + b"b"  # past the truncation: zeros until written again
    os.close(fd)
    (m / "dir").mkdir()
    return {p.name: p.stat().st_size for p in m.iterdir() if p.is_file()}


async def test_a_file_removed_or_replaced_leaves_no_data_behind(disk):
    m = disk.mount
    (m / "a").write_bytes(b"first")
    os.unlink(m / "a")
    (m / "a").write_bytes(b"second, longer")
    fd = os.open(m / "a", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    (m / "b").write_bytes(b"unsynced")
    os.replace(m / "a", m / "b")
    await disk.cut()
    await disk.start()
    assert sorted(p.name for p in m.iterdir()) == ["b"]
    assert (m / "b").read_bytes() == b"second, longer"


@pytest.mark.parametrize("sync_always", [True, False], ids=["synced", "default-sync"])
async def test_nats_server_keeps_its_acknowledged_messages_through_a_cut_only_when_it_syncs_them(disk, sync_always):
    server = NatsServer(disk.mount / "nats", sync_always=sync_always)
    await server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        acked = [(await js.publish(f"t.{n % 5}", b"x" * 200)).seq for n in range(200)]
        await nc.close()
        await server.stop(kill=True)
        await disk.cut()
        await disk.start()
        await server.start()
        nc = await nats.connect(server.url)
        try:
            found = (await nc.jetstream().stream_info("T")).state.last_seq
        except nats.js.errors.NotFoundError:
            found = 0  # its metadata lost: the whole stream gone, as Jepsen saw with the default
        await nc.close()
    finally:
        await server.stop()
    if sync_always:
        assert found == acked[-1] == 200
    else:
        assert found < acked[-1]  # the tool can tell: without syncing, a cut loses acknowledged messages
