"""What syncing every write costs nats-server itself: one R1 file stream, publishes of 300 bytes.

    python bench/sync.py [--seconds S]

For `sync_interval: always` (what every nats-server the scaler starts runs) and JetStream's default
(fsync every 2 minutes): a lone publish's round trip (p50, one after another), and publishes per second
with 50 in flight on 50 subjects, as 50 functions' appends would be.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.runtime.bus import connected  # noqa: E402
from scaler.runtime.natsd import NatsServer  # noqa: E402
from scaler.runtime.service import run  # noqa: E402

PAYLOAD = b"x" * 300


async def measure(sync_always: bool, seconds: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as store:
        async with NatsServer(Path(store) / "nats", sync_always=sync_always) as nats:
            async with connected(nats.url, "bench") as nc:
                await nc.jetstream().add_stream(name="BENCH", subjects=["bench.>"])
                lone = []
                for n in range(500):
                    began = time.perf_counter()
                    await nc.request(f"bench.{n % 50}", PAYLOAD, timeout=5)
                    lone.append((time.perf_counter() - began) * 1000)
                done, stop = 0, time.perf_counter() + seconds

                async def writer(k: int) -> None:
                    nonlocal done
                    while time.perf_counter() < stop:
                        await nc.request(f"bench.{k}", PAYLOAD, timeout=5)
                        done += 1

                began = time.perf_counter()
                await asyncio.gather(*(writer(k) for k in range(50)))
                return statistics.median(lone), done / (time.perf_counter() - began)


async def bench(seconds: float) -> str:
    lines = ["| nats-server | lone publish p50 | publishes/s, 50 in flight |", "|---|---:|---:|"]
    for sync_always, name in ((True, "sync_interval: always"), (False, "default (fsync every 2 min)")):
        p50, rate = await measure(sync_always, seconds)
        lines.append(f"| {name} | {p50:.3f} ms | {rate:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="how long the 50 publishers run")
    print(run(bench(p.parse_args().seconds)))


if __name__ == "__main__":
    main()
