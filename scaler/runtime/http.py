"""A small HTTP endpoint on the event loop, for what operators read: metrics, a run's statistics.

No threads (prometheus_client's own server runs one) and no framework: each GET is answered from
the loop, so whatever a page reads (the controller's state, a run's calls) is read between two
steps of the service, never in the middle of one. One request per connection.
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from scaler.runtime.ports import CannotListen

log = logging.getLogger("scaler.http")

# Content type and body, made when asked for; or a status line ("503 Service Unavailable") before them.
Page = Callable[[], tuple[str, bytes] | tuple[str, str, bytes]]
READ_TIMEOUT_S = 10.0


class HttpEndpoint:
    """Serves `pages` (path -> Page) on `listen` (HOST:PORT, port 0: any free one)."""

    def __init__(self, listen: str, pages: dict[str, Page], what: str = "http") -> None:
        self.listen = listen
        self.pages = pages
        self.what = what
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        host, _, port = self.listen.rpartition(":")
        try:
            self._server = await asyncio.start_server(self._serve, host.strip("[]") or None, int(port))
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)  # uvloop's own text repeats the address
            raise CannotListen(self.listen, why, self.what) from None
        self.port = self._server.sockets[0].getsockname()[1]
        return f"{self.what} on {host or '0.0.0.0'}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                request = await reader.readline()
                while (await reader.readline()).strip():  # the headers: nothing we need
                    pass
            method, path, *_ = request.decode("latin-1").split() or ["", ""]
            page = self.pages.get(path.split("?", 1)[0])
            if method != "GET":
                status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif page is None:
                status, kind, body = "404 Not Found", "text/plain", f"try {', '.join(self.pages)}\n".encode()
            else:
                made = page()
                status, kind, body = made if len(made) == 3 else ("200 OK", *made)
            head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
            writer.write(head.encode() + b"\r\n" + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            pass
        except Exception:  # a page that failed: the service goes on
            log.exception("%s: could not answer", self.what)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
