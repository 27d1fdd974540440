"""Faults done to a running scaler's store, for the fault tests and scripts/faults.py."""

import asyncio

from nats.js import JetStreamContext

from scaler.controller import snapshots


async def tear_snapshot(js: JetStreamContext, partition: int, drop: bool = False) -> None:
    """Leave the partition's snapshot as a write cut short would: its last chunk half written, or (`drop`) gone."""
    store = await js.object_store(snapshots.BUCKET)
    info = await store.get_info(snapshots.name(partition))
    stream, chunks = f"OBJ_{snapshots.BUCKET}", f"$O.{snapshots.BUCKET}.C.{info.nuid}"
    last = await js.get_last_msg(stream, chunks)
    await js.delete_msg(stream, last.seq)
    if not drop:
        await js.publish(chunks, last.data[: len(last.data) // 2], stream=stream)


class Link:
    """A TCP link between a part and NATS that the test can cut: while cut, what either side sends is dropped,
    as a network partition would (a SIGSTOPped server would still read, and act on, what reached its socket).
    With `hold`, it is held instead and delivered once the link is mended, in order, as TCP does for a
    partition that heals before its connection times out: what a cut-off node sent arrives late."""

    def __init__(self, target_host: str, target_port: int, hold: bool = False) -> None:
        self.target = (target_host, target_port)
        self.hold = hold
        self.port = 0
        self._mended = asyncio.Event()
        self._mended.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task] = set()

    @property
    def cut(self) -> bool:
        return not self._mended.is_set()

    @cut.setter
    def cut(self, cut: bool) -> None:
        if cut:
            self._mended.clear()
        else:
            self._mended.set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def __aenter__(self) -> "Link":
        self._server = await asyncio.start_server(self._join, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for pump in (self._pump(reader, up_writer), self._pump(up_reader, writer)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.cut and not self.hold:
                    continue
                await self._mended.wait()  # held: sent once mended
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
