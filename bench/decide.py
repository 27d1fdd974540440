"""What a decision costs: CPU time of the core's `decide` per policy and per command kind, offline.

    .venv/bin/python bench/decide.py [--datasets dataSet_1 dataSet_3] [--policies demo learned] [--requests N]
                                     [--arithmetic] [--idle-ms MS]

Each dataset is simulated offline (scaler/simulator/offline.py) with each policy, and every decision is
timed in CPU (time.process_time_ns around the ledger's `decide` and the `plan` after it: the command's own
change and reply, the events they emit folded into the state, features included, and the policy's plans
beside the reply). Prints a Markdown table: dataset x policy x command kind -> decisions, p50, p99 and mean
in µs (and of the mean, the reply's: what the caller waits for), and their CPU in all;
each policy's `all` row beside the simulation's own CPU and wall time (the simulator, the ledger and the
platform model besides the decisions) and the run's score. Ratios are to the first policy on the same
dataset, in the same run. `--requests N` simulates only each dataset's first N requests (dataSet_3's
436,546 take several minutes with `learned`). `--arithmetic` times apart, in a table after it, the calls
the policies make into policy/forecast.py (the array arithmetic of `learned`'s plans), and each run's CPU
without them: how fast the run could be were that arithmetic free (compiled, say). It adds a few µs a
call to what it times. `--idle-ms MS` lets the machine idle that long before each command's decision, as a live
run's calls come apart (the busiest minute of dataSet_1: some 11 ms between two): a decision then costs several
times what it costs back to back, its code and data no longer in the core's caches; use it with `--requests`.
Not a test: the numbers depend on the machine and its load.
"""

import argparse
import functools
import inspect
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaler.controller.core.policy import POLICIES, forecast, get_policy  # noqa: E402
from scaler.controller.ledger import Ledger  # noqa: E402
from scaler.runtime.service import at_least  # noqa: E402
from scaler.simulator.dataset import Dataset, load_dataset  # noqa: E402
from scaler.simulator.offline import Simulation  # noqa: E402

DATASETS_DIR = ROOT.parent / "shared" / "datasets"
KINDS = ("Assign", "Idle", "Tick", "SlotReady", "Cue", "SlotDestroyed")  # in this order; any other after them


class TimedLedger(Ledger):
    """A ledger that records the CPU time of each decision, by command kind."""

    def __init__(self, idle_s: float = 0.0) -> None:
        super().__init__()
        self.idle_s = idle_s  # slept before each command's decision (--idle-ms)
        self.took: dict[str, list[int]] = defaultdict(list)  # the reply and the plan after it, per command
        self.replied: dict[str, list[int]] = defaultdict(list)  # the reply alone (what its caller waits for)
        self._kind = ""

    def decide(self, cmd, now, policy, after=None):
        if self.idle_s:
            time.sleep(self.idle_s)
        began = time.process_time_ns()
        d = super().decide(cmd, now, policy, after)
        self._kind = type(cmd).__name__
        self.replied[self._kind].append(time.process_time_ns() - began)
        return d

    def plan(self, key, now, policy):
        """The plan after the command just decided (the simulation plans once after each): its time is the
        command's too."""
        began = time.process_time_ns()
        planned = super().plan(key, now, policy)
        self.took[self._kind].append(self.replied[self._kind][-1] + time.process_time_ns() - began)
        return planned


class Arithmetic:
    """CPU time and calls of each function of policy/forecast.py, as the policies call it (outermost calls
    only), once `install`ed: each module of the policies gets a timing wrapper in place of what it imported."""

    def __init__(self) -> None:
        self.took: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._inside = False

    def install(self) -> None:
        for name, module in list(sys.modules.items()):
            if not name.startswith("scaler.controller.core.policy.") or module is forecast:
                continue
            for attr, fn in vars(module).items():
                if inspect.isfunction(fn) and fn.__module__ == forecast.__name__:
                    setattr(module, attr, self._timed(fn))

    def clear(self) -> None:
        self.took.clear()
        self.calls.clear()

    def _timed(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._inside:
                return fn(*args, **kwargs)
            self._inside, began = True, time.process_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self._inside = False
                self.took[fn.__name__] += time.process_time_ns() - began
                self.calls[fn.__name__] += 1

        return timed

    def rows(self, name: str, policy: str, cpu: float, base: float):
        for fn, ns in self.took.most_common():
            n = self.calls[fn]
            yield f"| {name} | {policy} | {fn} | {n:,} | {ns / 1e9:,.2f} | {ns / n / 1000:,.1f} | |"
        total = sum(self.took.values()) / 1e9
        without = cpu - total
        ratio = f" ({without / base:.2f}x)" if base else ""
        yield f"| {name} | {policy} | all | {sum(self.calls.values()):,} | {total:,.2f} | | {without:,.1f}{ratio} |"


def quantile(ordered: list[int], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def measure(dataset: Dataset, policy: str, idle_s: float = 0.0) -> tuple[TimedLedger, float, float, float]:
    """The ledger with each kind's decision times (ns), the simulation's CPU and wall seconds, and its score."""
    ledger = TimedLedger(idle_s)
    wall, cpu = time.perf_counter(), time.process_time()
    run = Simulation(dataset, get_policy(policy), ledger=ledger).run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return ledger, cpu, wall, run.stats().score


def rows(name: str, policy: str, ledger: TimedLedger, cpu: float, wall: float, score: float, base: float):
    took, replied = ledger.took, ledger.replied
    kinds = [k for k in KINDS if k in took] + sorted(k for k in took if k not in KINDS)
    everything = sorted(t for times in took.values() for t in times)
    for kind in [*kinds, "all"]:
        times = everything if kind == "all" else sorted(took[kind])
        reply = [t for times in replied.values() for t in times] if kind == "all" else replied[kind]
        total = sum(times) / 1e9
        cells = [name, policy, kind, f"{len(times):,}", f"{quantile(times, 0.5):,.1f}", f"{quantile(times, 0.99):,.1f}"]
        cells += [f"{sum(times) / len(times) / 1000:,.1f}", f"{sum(reply) / len(reply) / 1000:,.1f}", f"{total:,.2f}"]
        if kind == "all":
            ratio = f"{cpu / base:.2f}x" if base else "1.00x"
            cells += [f"{cpu:,.1f} ({ratio})", f"{wall:,.1f}", f"{score:.2f}"]
        else:
            cells += ["", "", ""]
        yield "| " + " | ".join(cells) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["dataSet_1", "dataSet_3"], metavar="NAME")
    p.add_argument("--policies", nargs="+", default=["demo", "learned"], choices=list(POLICIES), metavar="NAME")
    p.add_argument("--requests", type=int, default=0, help="simulate only each dataset's first N requests")
    p.add_argument("--datasets-dir", type=Path, default=DATASETS_DIR, metavar="DIR")
    p.add_argument("--arithmetic", action="store_true", help="time the policies' calls into forecast.py apart")
    p.add_argument("--idle-ms", type=at_least(0), default=0.0, help="idle this long before each decision, as live")
    args = p.parse_args()
    arithmetic = Arithmetic() if args.arithmetic else None
    if arithmetic:
        for policy in args.policies:
            get_policy(policy)  # its module imported, so that its calls can be timed
        arithmetic.install()
    apart = []
    head = (
        "dataset",
        "policy",
        "command",
        "decisions",
        "p50 µs",
        "p99 µs",
        "mean µs",
        "of it reply µs",
        "decide CPU s",
    )
    head += ("run CPU s (to the first policy)", "run wall s", "score")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if h in ("dataset", "policy", "command") else "---:" for h in head) + "|", flush=True)
    for name in args.datasets:
        dataset = load_dataset(args.datasets_dir / name)
        if args.requests:
            dataset = Dataset(dataset.name, dataset.metas, dataset.requests[: args.requests])
            name = f"{name} (first {args.requests:,})"
        base = 0.0
        for policy in args.policies:
            if arithmetic:
                arithmetic.clear()
            ledger, cpu, wall, score = measure(dataset, policy, args.idle_ms / 1000)
            print("\n".join(rows(name, policy, ledger, cpu, wall, score, base)), flush=True)
            if arithmetic:
                apart += arithmetic.rows(name, policy, cpu, base)
            base = base or cpu
    if arithmetic:
        print("\n| dataset | policy | forecast.py's | calls | CPU s | µs a call", end="")
        print(" | run CPU s without it (to the first policy) |")
        print("|---|---|---|---:|---:|---:|---:|")
        print("\n".join(apart))
    return 0


if __name__ == "__main__":
    sys.exit(main())
