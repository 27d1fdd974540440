"""The nats-server we start: the ports it listens on, which a restart must find free again."""

import socket
from pathlib import Path

import nats
import pytest

from scaler.runtime import natsd
from scaler.runtime.natsd import NatsServer
from scaler.runtime.ports import free_port


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_a_server_given_no_port_listens_below_the_ephemeral_range_and_restarts_there(tmp_path):
    """A restart listens where the first start did. A port the kernel picked (ephemeral) can meanwhile be taken as the
    local end of any outgoing connection on the machine, and the restart then fails for as long as that connection
    lives (it did, in CI: the monitor port, while a node's leases lapsed); the kernel never hands out one below its
    ephemeral range."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    try:
        first = server.url, server.monitor_url
        assert port_of(server.url) < ephemeral_low() and port_of(server.monitor_url) < ephemeral_low(), first
        await server.stop()
        await server.start()
        assert (server.url, server.monitor_url) == first
        nc = await nats.connect(server.url)
        await nc.close()
    finally:
        await server.stop()


async def test_a_drawn_port_taken_before_the_server_binds_it_is_drawn_again(tmp_path, monkeypatch):
    """A port drawn for it can be bound by another process before the server binds it: the start draws again rather
    than fail. One the caller gave, or a restart's, is not changed."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port()))
    taken.listen()
    busy = taken.getsockname()[1]
    draws = iter([busy])
    monkeypatch.setattr(natsd, "free_port", lambda: next(draws, None) or free_port())
    server = NatsServer(tmp_path / "nats")
    try:
        await server.start()
        assert port_of(server.url) != busy
        nc = await nats.connect(server.url)
        await nc.close()
    finally:
        await server.stop()
        taken.close()


async def test_a_given_port_in_use_is_refused_not_moved(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port()))
    taken.listen()
    server = NatsServer(tmp_path / "nats", port=taken.getsockname()[1])
    try:
        with pytest.raises(RuntimeError, match="address already in use"):
            await server.start()
    finally:
        await server.stop()
        taken.close()
