"""Faults done to a running scaler's store, for the fault tests and scripts/faults.py."""

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
