"""How durable an acknowledgement is: whether the NATS servers sync every write to disk, and how many
replicas the scaler's streams and buckets get.

JetStream acks a publish once it is in the server's page cache; by default it fsyncs every 2
minutes (`sync_interval`), so a power loss (or an OS crash) can lose acknowledged writes. Every
nats-server the scaler starts or ships a configuration for runs with `sync_interval: always`. A
server given with `--nats` is asked through its monitoring port (`/varz`: `jetstream.config.sync_always`),
the only place a client can read it; a server that does not sync every write is used with one
warning, unless the operator says that is intended.
"""

import asyncio
import json
import logging
from enum import Enum
from urllib.parse import urlsplit

from nats.aio.client import Client

from scaler.runtime.access import Nats, servers, url_of

log = logging.getLogger("scaler.durability")

MONITOR_PORT = 8222  # nats-server's usual monitoring port (`-m 8222`)
CLUSTER_REPLICAS = 3  # on a cluster: a quorum of 2 survives one server lost; never 2 (no quorum after one loss)
ASK_S = 2.0


class Sync(Enum):
    ALWAYS = "every write synced to disk"
    INTERVAL = "writes synced to disk only every sync_interval"
    UNKNOWN = "whether writes are synced to disk is unknown"

    @property
    def gauge(self) -> int:
        """For the metric: 1 synced, 0 not, -1 unknown."""
        return {Sync.ALWAYS: 1, Sync.INTERVAL: 0, Sync.UNKNOWN: -1}[self]


def monitor_urls(nats_url: Nats, monitor: str = "") -> list[str]:
    """Where to ask: `monitor` (comma-separated http URLs) or each server's host on the usual monitoring port."""
    if monitor:
        return [u.strip().rstrip("/") for u in monitor.split(",") if u.strip()]
    hosts = [urlsplit(u if "://" in u else f"nats://{u}").hostname or "127.0.0.1" for u in servers(url_of(nats_url))]
    return [f"http://{h}:{MONITOR_PORT}" for h in dict.fromkeys(hosts)]


async def monitor_get(url: str, path: str) -> tuple[int, bytes]:
    """GET <url><path> from a nats-server's monitoring endpoint with the standard library: status and body."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if not status.startswith(b"HTTP/1.") or len(status.split()) < 2 or not status.split()[1].isdigit():
        raise ValueError(status.decode(errors="replace"))
    return int(status.split()[1]), body


async def _varz(url: str) -> dict:
    """GET <url>/varz (a few hundred bytes, once at start)."""
    status, body = await monitor_get(url, "/varz")
    if status != 200:
        raise ValueError(f"/varz answered {status}")
    return json.loads(body)


async def server_sync(urls: list[str]) -> Sync:
    """ALWAYS when every server asked says `sync_always`, INTERVAL when one does not, UNKNOWN when none answers."""
    answers = await asyncio.gather(*(asyncio.wait_for(_varz(u), ASK_S) for u in urls), return_exceptions=True)
    said = [a for a in answers if isinstance(a, dict)]
    if not said:
        return Sync.UNKNOWN
    if all(((a.get("jetstream") or {}).get("config") or {}).get("sync_always") for a in said):
        return Sync.ALWAYS if len(said) == len(urls) else Sync.UNKNOWN
    return Sync.INTERVAL


def default_replicas(nc: Client) -> int:
    """3 on a cluster, 1 on a lone server: what streams and buckets get unless told otherwise."""
    return CLUSTER_REPLICAS if nc._server_info.get("cluster") else 1


def describe(sync: Sync, replicas: int) -> str:
    """The durability a node runs under, for its start line."""
    copies = f"{replicas} replicas" if replicas > 1 else "1 replica"
    return f"{sync.value}, {copies}"


def warn(sync: Sync, urls: list[str], allowed: bool) -> None:
    """One line when an acknowledgement may not be on disk, unless the operator said that is intended."""
    if sync is Sync.ALWAYS or allowed:
        return
    where = ", ".join(urls)
    if sync is Sync.INTERVAL:
        log.warning(
            "NATS does not sync every write (%s says sync_always false): an acknowledged decision can be lost"
            " in a power loss; set `jetstream { sync_interval: always }`, or pass --nats-unsynced if intended",
            where,
        )
    else:
        log.warning(
            "cannot tell whether NATS syncs every write (no monitoring answered at %s): give --nats-monitor,"
            " or pass --nats-unsynced if writes need not be on disk when acknowledged",
            where,
        )
