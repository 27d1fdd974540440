"""What a new user meets around `scaler up`: a prompt stop however it ends, and one clear line for a bad start."""

import asyncio

from tests.processes import free_port
from tests.stack import eventually
from tests.test_up import alive, descendants, part_pid, reap, served, start_up, stop


async def test_a_killed_scaler_up_frees_its_ports_at_once_when_its_nats_went_with_it():
    """kill -9 of `scaler up` takes its embedded NATS down too: the node has nowhere to save its snapshots
    or give its leases back, so it must leave at once rather than wait out NATS's timeouts on its port."""
    port = free_port()
    proc, address, _ = await start_up("--port", str(port))
    parts = descendants(proc.pid)
    node, nats = part_pid(proc, "scaler node"), part_pid(proc, "bin/nats-server")
    try:
        assert await served(address, "held") == "held-1"  # a partition served: a snapshot to write at stop
        proc.kill()
        await eventually(lambda: not alive(nats), 30)
        await eventually(lambda: not alive(node), 5)  # waiting on the gone NATS took 11 s and more
        said = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        assert "could not write the snapshot" not in said and "Traceback" not in said, said
        again, address, _ = await start_up("--port", str(port))  # its port is free for the next one
        try:
            assert await served(address, "next") == "next-1"
        finally:
            code, rest = await stop(again)
        assert code == 0, rest
    finally:
        reap(parts)
