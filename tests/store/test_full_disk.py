"""A full disk under the event store: said in nats-server's own words, reported as such, and mended once space is
back (scaler/runtime/storehealth.py, natsd.Relay, `scaler up`'s restart of its nats-server)."""

import asyncio
import errno
import logging
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from scaler.runtime import natsd
from scaler.runtime.durability import monitor_get
from scaler.runtime.natsd import Relay
from scaler.runtime.storehealth import Trouble, breaks_stream, classify
from tests.cli.test_up import Log, assign_and_idle, start_up

# What nats-server 2.15.1 said, filled on a 32 MB filesystem.
CRITICAL = (
    "[6859] 2026/11/26 14:49:40.734 [ERR] Filestore [EVENTS] Critical write error: write"
    " /disk/nats/jetstream/$G/streams/EVENTS/msgs/1.blk: no space left on device"
)
HEALTH = "JetStream stream '$G > EVENTS' write error: write /d/1.blk: no space left on device"


def test_what_the_store_says_is_told_apart():
    assert classify(HEALTH) is Trouble.DISK_FULL
    assert classify("nats: ServerError: code=500 err_code=10051 description='write x: no space left on device'")
    assert classify("JetStream stream '$G > EVENTS' write error: input/output error") is Trouble.WRITE_ERROR
    assert classify("event store refused the batch: atomic publish batch is incomplete") is Trouble.UNAVAILABLE
    assert classify("nats: JetStream not enabled") is Trouble.UNAVAILABLE
    assert classify("wrong last sequence: 12") is None
    assert breaks_stream(CRITICAL) and not breaks_stream("JetStream not enabled")


def test_nats_servers_log_is_relayed_a_line_each_and_at_most_ten_a_minute(caplog):
    caplog.set_level(logging.DEBUG, logger="scaler.natsd")
    now = [0.0]
    heard: list[tuple[int, str]] = []
    relay = Relay(lambda level, text: heard.append((level, text)), clock=lambda: now[0])
    relay.line("[1] 2026/11/26 14:39:51.313 [INF] Starting nats-server\n")
    relay.line("[1] 2026/11/26 14:39:51.313 [INF]\n")  # a blank line of its banner
    for n in range(40):  # one refused write every 2 s
        relay.line(CRITICAL.replace("Critical", f"#{n} Critical") + "\n")
        now[0] += 2
    relay.tick()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said[0] == (logging.ERROR, "nats-server: " + CRITICAL.split("[ERR] ")[1].replace("Critical", "#0 Critical"))
    assert len(said) == 10 + 1 + 10  # ten, the other 20 of that minute summed up, then the next minute's ten
    summary = "nats-server: 20 more lines in the last 60s not shown (the latest: Filestore [EVENTS] #29"
    assert said[10][1].startswith(summary), said[10]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["nats-server: Starting nats-server"]
    assert heard[0] == (logging.DEBUG, "Starting nats-server") and len(heard) == 41


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MB filesystem (tmpfs: root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)]).returncode:
        pytest.skip("needs root, to mount a small filesystem")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


async def test_a_full_disk_is_said_and_reported_and_once_space_is_back_nats_is_restarted_and_serves(small_disk):
    proc, address, lines = await start_up("--data-dir", str(small_disk), "--metrics-port", "0", "--store-limit-gb",
                                          "0.01")  # fmt: skip
    log = Log(proc, lines)
    try:
        metrics = re.search(r"metrics (http://\S+)/metrics", "".join(lines)).group(1)
        await assign_and_idle(address, "before")
        filler = await asyncio.to_thread(fill, small_disk)
        await log.wait_for("no space left on device")  # nats-server's own words, relayed
        await log.wait_for("the store's disk is full")
        health = [(0, b"")]

        async def unhealthy() -> bool:
            health[0] = await monitor_get(metrics, "/healthz")
            return health[0][0] == 503

        async with asyncio.timeout(10):
            while not await unhealthy():  # noqa: ASYNC110 (another process's page, asked again)
                await asyncio.sleep(0.2)
        assert b"the event store refuses writes: disk full" in health[0][1], health
        assert b'scaler_store_refusing{cause="disk_full"} 1.0' in (await monitor_get(metrics, "/metrics"))[1]
        filler.unlink()
        await log.wait_for("nats-server restarted", seconds=30)
        assert await assign_and_idle(address, "after")  # served again (it waits out the take-back of its leases)
        assert log.count("Traceback") == 0
        assert log.count("nats-server: ") <= natsd.RELAY_LINES + 1 + 2  # rate-limited (and its restart's lines)
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            err = await log.close()
            code = await proc.wait()
    assert code == 0, err
