"""What syncing every write costs nats-server itself, and what sharing one commit saves or costs.

    python bench/sync.py [--seconds S] [--rounds N]

For `sync_interval: always` (what every nats-server the scaler starts runs) and JetStream's default
(fsync every 2 minutes): a lone publish's round trip (p50, one after another), and publishes per second
with 50 in flight on 50 subjects, as 50 functions' appends would be (one R1 file stream, 300 bytes each).

Then shared commits (scaler/store/commits.py): n functions' appends at once, each sent alone, against the
same n as one atomic batch, on the EVENTS stream as the node appends to it (its subjects, its order check,
1.5 kB batches, every write synced), on a lone server (R1) and on a three-server cluster (R3): the p50 of the
time until all n are acked, `--rounds` rounds of 100 each. A lone server stages an atomic batch on disk before
it commits it; a cluster stages it in memory and replicates it once.
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

from scaler.proto.subjects import event_subject, function_events  # noqa: E402
from scaler.runtime.bus import connected  # noqa: E402
from scaler.runtime.natsd import NatsCluster, NatsServer  # noqa: E402
from scaler.runtime.service import run  # noqa: E402
from scaler.store import stream  # noqa: E402
from scaler.store.config import ensure_stream  # noqa: E402

PAYLOAD = b"x" * 300
BATCH = b"x" * 1500  # about a warm Assign's batch
SHARED = (1, 2, 3, 5, 10, 20, 50)  # functions appending at once


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


async def shared_commits(url: str, replicas: int, rounds: int) -> list[tuple[int, float, float]]:
    """For each n of SHARED: the p50 ms until n functions' appends are all acked, sent alone and as one batch."""
    async with connected(url, "bench") as nc:
        await ensure_stream(nc.jetstream(), replicas=replicas, atomic=True)
        last: dict[str, int] = {}

        def append(key: str) -> stream.Append:
            return stream.Append(event_subject(key), BATCH, function_events(key), last.get(key, 0))

        async def alone(keys: list[str]) -> None:
            appends = [append(k) for k in keys]
            seqs = await asyncio.gather(
                *(stream.append(nc, a.subject, a.data, a.key_subjects, a.last_seq, 5) for a in appends)
            )
            last.update(zip(keys, seqs, strict=True))

        async def together(keys: list[str]) -> None:
            if len(keys) == 1:
                return await alone(keys)
            last.update(zip(keys, await stream.append_all(nc, [append(k) for k in keys], 5), strict=True))

        rows = []
        for n in SHARED:
            keys = [f"fn{k}" for k in range(n)]
            took: dict[str, list[float]] = {"alone": [], "together": []}
            for _ in range(rounds):
                for how, send in (("alone", alone), ("together", together)):
                    for _ in range(100):
                        began = time.perf_counter()
                        await send(keys)
                        took[how].append((time.perf_counter() - began) * 1000)
                        await asyncio.sleep(0.002)  # the disk idle a moment, as between a live run's calls
            rows.append((n, statistics.median(took["alone"]), statistics.median(took["together"])))
        return rows


async def bench(seconds: float, rounds: int) -> str:
    lines = ["| nats-server | lone publish p50 | publishes/s, 50 in flight |", "|---|---:|---:|"]
    for sync_always, name in ((True, "sync_interval: always"), (False, "default (fsync every 2 min)")):
        p50, rate = await measure(sync_always, seconds)
        lines.append(f"| {name} | {p50:.3f} ms | {rate:,.0f} |")
    lines += ["", "| stream | functions appending at once | each alone, p50 | one atomic batch, p50 |"]
    lines += ["|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as store:
        async with NatsServer(Path(store) / "nats") as nats:
            r1 = await shared_commits(nats.url, 1, rounds)
        async with NatsCluster(Path(store) / "cluster") as cluster:
            r3 = await shared_commits(cluster.url, 3, rounds)
    for name, rows in (("R1, a lone server", r1), ("R3, a cluster of three", r3)):
        lines += [f"| {name} | {n} | {a:.2f} ms | {t:.2f} ms |" for n, a, t in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="how long the 50 publishers run")
    p.add_argument("--rounds", type=int, default=2, help="rounds of 100 for each count of shared commits")
    a = p.parse_args()
    print(run(bench(a.seconds, a.rounds)))


if __name__ == "__main__":
    main()
