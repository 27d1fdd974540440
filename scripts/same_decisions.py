"""Whether two versions of the code decide the same: every trace of bench/policies.py offline, each decision kept.

    .venv/bin/python scripts/same_decisions.py record DIR [--policy learned] [--traces ...] [--seeds ...]
    .venv/bin/python scripts/same_decisions.py compare BEFORE_DIR AFTER_DIR

`record` simulates each trace (the shared datasets and the generated shapes on seeds 0-5, as
bench/policies.py runs them) and writes, per trace, a digest of each decision in order (the command, the
time, the events, the replies and the next deadline) and one line to DIR/runs.jsonl: the score, the
cold starts, the slot GB·s, how many decisions, a digest of them all, the run's wall and CPU seconds.
Run it with the code before a change (a checkout of it, on PYTHONPATH) and after; `compare` prints a
Markdown table: each trace's score before and after, and whether every decision is the same, or the
first that differs and how many do (`--first N`: print the commands around decision N of a trace, to
see where two runs part). A refactor of a policy's arithmetic should leave every row `identical`.
"""

import argparse
import hashlib
import json
import sys
import time
from array import array
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import policies  # noqa: E402  (bench/policies.py: the traces and how to load them)

from scaler.controller.core.policy import get_policy  # noqa: E402
from scaler.simulator.offline import Simulation  # noqa: E402

_encode = msgspec.json.Encoder().encode


class Recording(Simulation):
    """A simulation that keeps a digest of every decision, in the order they are taken."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.digests = array("Q")
        self.whole = hashlib.blake2b(digest_size=16)
        self.show: tuple[int, int] | None = None  # decisions to print (from, to)

    def command(self, cmd, now):
        d = super().command(cmd, now)
        blob = _encode([now, type(cmd).__name__, cmd, d.events, d.replies, d.wake_ms])
        self.whole.update(blob)
        if self.show and self.show[0] <= len(self.digests) <= self.show[1]:
            print(len(self.digests), blob.decode())
        self.digests.append(int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little"))
        return d


def traces(names: list[str], seeds: list[int]):
    for name in names:
        for seed in seeds if name in policies.GENERATED else [0]:
            yield name, seed, policies.trace_name(name, seed)


def record(out: Path, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, seed, trace in traces(args.traces, args.seeds):
        sim = Recording(policies.load(name, args.datasets_dir, seed), get_policy(args.policy))
        if args.first is not None:
            sim.show = (args.first - 2, args.first + 2)
        wall, cpu = time.perf_counter(), time.process_time()
        stats = sim.run().stats()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        (out / f"{trace.replace('/', '_')}.bin").write_bytes(sim.digests.tobytes())
        row = {
            "trace": trace,
            "score": stats.score,
            "cold_starts": stats.cold_starts,
            "slot_gb_s": stats.total_slot_time_in_g_bs,
            "decisions": len(sim.digests),
            "digest": sim.whole.hexdigest(),
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
        }
        with open(out / "runs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{trace}: score {stats.score:.4f}, {len(sim.digests):,} decisions, {cpu:.1f} s CPU", flush=True)


def compare(before: Path, after: Path) -> None:
    def runs(folder: Path) -> dict[str, dict]:
        return {r["trace"]: r for r in map(json.loads, (folder / "runs.jsonl").read_text().splitlines())}

    def digests(folder: Path, trace: str) -> array:
        out = array("Q")
        out.frombytes((folder / f"{trace.replace('/', '_')}.bin").read_bytes())
        return out

    old, new = runs(before), runs(after)
    print("| trace | score before | score after | change | decisions | the same? | CPU s before | CPU s after |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for trace, b in old.items():
        if trace not in new:
            continue
        a = new[trace]
        if a["digest"] == b["digest"]:
            same = "identical"
        else:
            x, y = digests(before, trace), digests(after, trace)
            first = next((n for n, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            differ = sum(p != q for p, q in zip(x, y, strict=False)) + abs(len(x) - len(y))
            same = f"from decision {first:,} on ({differ:,} differ)"
        change = a["score"] - b["score"]
        cells = [trace, f"{b['score']:.4f}", f"{a['score']:.4f}", f"{change:+.4f}", f"{a['decisions']:,}", same]
        print("| " + " | ".join([*cells, f"{b['cpu_s']:.1f}", f"{a['cpu_s']:.1f}"]) + " |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["record", "compare"])
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    p.add_argument("--policy", default="learned")
    p.add_argument("--traces", nargs="+", default=policies.DATASETS + policies.GENERATED, metavar="NAME")
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(6)))
    p.add_argument("--datasets-dir", type=Path, default=policies.DATASETS_DIR, metavar="DIR")
    p.add_argument("--first", type=int, metavar="N", help="record: print the decisions around decision N")
    args = p.parse_args()
    if args.mode == "record":
        record(args.dirs[0], args)
    else:
        compare(*args.dirs[:2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
