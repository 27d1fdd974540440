"""Whether the event store takes writes, and if not, why: its disk full, a write error, or JetStream away.

What nats-server (2.15) does when its disk fills, measured on a 32 MB filesystem: the stream being
written logs `Critical write error: ... no space left on device` and from then on answers no publish
at all, so an append only times out (an atomic batch: "batch is incomplete"). Its monitoring
endpoint's full health check (`/healthz`; the `js-enabled-only` one still says ok) answers 503 with
that error while the disk is full, and ok again once space is back, although the stream still takes
no write until the server is restarted. So a write error is remembered until that server restarted
(its `/varz` start time changed) or the node stored a write again (its stream sequence moved).

`classify` names the trouble in an error's text (the health check's, or an append's); `StoreWatch`
asks each monitoring endpoint every few seconds and keeps what it says, for the node's metric
(`scaler_store_refusing`), its `/healthz` page, and the message of the UNAVAILABLE its callers get.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from prometheus_client.core import GaugeMetricFamily, Metric

from scaler.runtime.durability import ASK_S, monitor_get
from scaler.runtime.tasks import cancelled

log = logging.getLogger("scaler.store")

EVERY_S = 2.0


class Trouble(Enum):
    DISK_FULL = "disk full"
    WRITE_ERROR = "write error"
    UNAVAILABLE = "unavailable"


# In the order they are told apart: a write error for want of space is a full disk.
MARKS = {
    Trouble.DISK_FULL: (
        "no space left on device",
        "disk quota exceeded",
        "insufficient resources",
        "insufficient storage",
        "resource limits exceeded",
    ),
    Trouble.WRITE_ERROR: ("write error",),
    Trouble.UNAVAILABLE: (
        "jetstream not enabled",
        "temporarily unavailable",
        "no responders",
        "timeout",
        "timed out",
        "batch is incomplete",
    ),
}
LASTING = (Trouble.DISK_FULL, Trouble.WRITE_ERROR)  # a stream they hit takes no write until its server restarts


def breaks_stream(log_line: str) -> bool:
    """Whether a line of nats-server's log tells of a write that failed on its disk: the stream it hit takes no
    write until the server restarts."""
    low = log_line.lower()
    return "write error" in low or "no space left on device" in low


def classify(text: str) -> Trouble | None:
    """What an error's text says of the store: None when it says nothing of it."""
    low = text.lower()
    return next((trouble for trouble, marks in MARKS.items() if any(m in low for m in marks)), None)


@dataclass(frozen=True)
class Seen:
    trouble: Trouble
    detail: str  # the server's own words
    where: str  # its monitoring endpoint
    started: str  # its start time then (/varz), to tell a restart
    seq: int  # the node's stream sequence then, to tell a write stored since


class StoreWatch:
    """What each nats-server's monitoring endpoint says of the store, kept up to date every `every_s`.

    `progress` is the newest stream sequence the node folded or appended: once it moves, writes are
    stored again. A monitoring endpoint that does not answer says nothing (the node's connection
    says whether NATS is away).
    """

    def __init__(self, monitors: list[str], progress: Callable[[], int] = lambda: 0, every_s: float = EVERY_S):
        self.monitors = monitors
        self.progress = progress
        self.every_s = every_s
        self.seen: dict[str, Seen] = {}  # by monitoring endpoint
        self._said_healthy: set[str] = set()  # endpoints said healthy again while their stream still fails
        self._task: asyncio.Task | None = None

    @property
    def trouble(self) -> Seen | None:
        """The worst trouble seen now, if any."""
        order = list(Trouble)
        return min(self.seen.values(), key=lambda s: order.index(s.trouble), default=None)

    def describe(self) -> str:
        """For a caller's UNAVAILABLE and the health page: "" when all is well."""
        seen = self.trouble
        if seen is None:
            return ""
        return f"the event store refuses writes: {seen.trouble.value} (nats-server at {seen.where}: {seen.detail})"

    def start(self) -> None:
        if self.monitors and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancelled(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self.look(url) for url in self.monitors))
            await asyncio.sleep(self.every_s)

    async def look(self, url: str) -> None:
        """Ask one server's health check, and keep what it says."""
        try:
            status, body = await asyncio.wait_for(monitor_get(url, "/healthz"), ASK_S)
        except (OSError, TimeoutError, ValueError):
            return
        seen = self.seen.get(url)
        if status == 200:
            if seen is not None and seen.trouble in LASTING and not await self._mended(url, seen):
                if url not in self._said_healthy:
                    self._said_healthy.add(url)
                    log.warning(
                        "nats-server at %s says it is healthy again, but a stream that had a write error takes no"
                        " write until that server restarts: restart it (scaler up restarts its embedded one)",
                        url,
                    )
                return
            if self.seen.pop(url, None) is not None:
                self._said_healthy.discard(url)
                log.warning("the event store at %s takes writes again", url)
            return
        detail = _error(body) or f"health check answered {status}"
        trouble = classify(detail) or Trouble.UNAVAILABLE
        if seen is not None and (seen.trouble in LASTING or seen.trouble is trouble):
            return  # known (a full disk's write error stays the cause: its later texts add nothing)
        started = await _started(url)
        self.seen[url] = Seen(trouble, detail, url, started, self.progress())
        log.error("the event store refuses writes: %s (nats-server at %s: %s)", trouble.value, url, detail)

    async def _mended(self, url: str, seen: Seen) -> bool:
        """Whether writes are stored again: the node's sequence moved, or the server was restarted."""
        if self.progress() > seen.seq:
            return True
        started = await _started(url)
        return bool(started) and started != seen.started

    def collect(self) -> Iterator[Metric]:
        """The metric: 1 for the trouble seen now (by cause), 0 for the others."""
        gauge = GaugeMetricFamily(
            "scaler_store_refusing",
            "Whether the event store refuses writes, by cause (disk_full, write_error, unavailable)",
            labels=["cause"],
        )
        now = self.trouble
        for trouble in Trouble:
            gauge.add_metric([trouble.name.lower()], 1 if now is not None and now.trouble is trouble else 0)
        yield gauge

    def health(self) -> tuple[str, str, bytes]:
        """A /healthz page of the store alone: 200 "ok", or 503 with the cause."""
        return page(self.describe())


def page(trouble: str) -> tuple[str, str, bytes]:
    """A /healthz page: 200 "ok" when `trouble` says nothing, else 503 with it."""
    if not trouble:
        return "200 OK", "text/plain", b"ok\n"
    return "503 Service Unavailable", "text/plain", f"{trouble}\n".encode()


def _error(body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(body).get("error", ""))
    return body.decode(errors="replace").strip()[:500]


async def _started(url: str) -> str:
    """The server's start time (/varz), "" when it does not say."""
    try:
        status, body = await asyncio.wait_for(monitor_get(url, "/varz"), ASK_S)
        return str(json.loads(body).get("start", "")) if status == 200 else ""
    except (OSError, TimeoutError, ValueError):
        return ""
