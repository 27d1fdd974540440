"""Traces of the shapes real functions have, generated from a seed: a fixture to hold policies to.

The shared datasets are three traces; a policy tuned on them can lose on others. These are
one hour each, small enough to simulate offline in seconds, made of:
- timers: a fixed period with jitter (a cron job), including a 60 s timer with an 11 s init
  and a 30 s timer jittered by ±3 ms;
- poisson: steady random traffic, at rates from one call in 10 minutes to a few a second;
- burst: on/off, e.g. ~80 calls within 5 s, then a pause of minutes;
- ramp: traffic that rises slowly to a peak and falls again;
- oneoff: functions called once to three times in the hour.
Memory 128 MB-4 GB, init 30 ms-12 s, runs 5 ms-20 s (each function has a mean run, each call
varies around it). `mixed` puts a few functions of every shape in one trace, as a held-out
trace would; each shape also has a trace of its own. Same seed, same trace.

    python -m scaler.simulator.shapes OUT_DIR [--seed N] [--traces mixed timer ...]

writes OUT_DIR/gen-<trace>/ with `metas` and `requests` in the challenge's format.
"""

import argparse
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from scaler.runtime.text import plural
from scaler.simulator.dataset import Dataset, FunctionMeta, Request

EPOCH_MS = 1_700_000_000_000  # the traces' start
SPAN_MS = 3_600_000
MEMORY_MB = (128, 256, 512, 1024, 2048, 4096)
RUNTIMES = ("python3.10", "nodejs18", "go1.x", "java11")

Calls = list[tuple[int, int, int]]  # (ms into the trace, duration ms, status code)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _meta(rng: random.Random, key: str, init_ms: int | None = None, memory_mb: int | None = None) -> FunctionMeta:
    return FunctionMeta(
        key=key,
        memory_in_mb=memory_mb or rng.choice(MEMORY_MB),
        init_duration_in_ms=init_ms or round(_log_uniform(rng, 30, 12_000)),
        runtime=rng.choice(RUNTIMES),
        timeout_in_secs=rng.choice((60, 300, 600)),  # well past any run: no lease cuts one short
    )


def _runs(rng: random.Random, low_ms: float = 5, high_ms: float = 20_000) -> Callable[[], int]:
    """A function's run times: a mean drawn once, each call within about ±30 % of it."""
    mean = _log_uniform(rng, low_ms, high_ms)
    return lambda: min(20_000, max(5, round(rng.lognormvariate(math.log(mean), 0.3))))


def _status(rng: random.Random, error_rate: float) -> int:
    return 500 if rng.random() < error_rate else 200


def _timer(rng: random.Random, span_ms: int, period_ms: int, jitter_ms: float, run: Callable[[], int]) -> Calls:
    """A tick every period from a random phase, each off by up to ±jitter (it does not accumulate)."""
    phase = rng.uniform(0, period_ms)
    ticks = range(int((span_ms - phase) // period_ms) + 1)
    times = (round(phase + k * period_ms + rng.uniform(-jitter_ms, jitter_ms)) for k in ticks)
    return [(t, run(), 200) for t in times if 0 <= t < span_ms]


def timers(rng: random.Random, n: int, span_ms: int, prefix: str = "timer") -> list[tuple[FunctionMeta, Calls]]:
    out = [
        (_meta(rng, f"{prefix}-60s-init11s", init_ms=11_000), _timer(rng, span_ms, 60_000, 500, _runs(rng, 5, 2_000))),
        (_meta(rng, f"{prefix}-30s-3ms"), _timer(rng, span_ms, 30_000, 3, _runs(rng, 5, 2_000))),
    ]
    for i in range(n - len(out)):
        period = rng.choice((10_000, 15_000, 60_000, 120_000, 300_000))
        jitter = _log_uniform(rng, 1, period / 20)
        out.append((_meta(rng, f"{prefix}-{i}"), _timer(rng, span_ms, period, jitter, _runs(rng))))
    return out


def _poisson(
    rng: random.Random, span_ms: int, rate_per_s: Callable[[float], float], peak: float, run, errors: float
) -> Calls:
    """Arrivals at `rate_per_s(t)` (at most `peak`), by thinning a Poisson process at the peak rate."""
    calls, t = [], rng.expovariate(peak / 1000)
    while t < span_ms:
        if rng.random() * peak < rate_per_s(t):
            calls.append((round(t), run(), _status(rng, errors)))
        t += rng.expovariate(peak / 1000)
    return calls


def poissons(rng: random.Random, n: int, span_ms: int, prefix: str = "poisson") -> list[tuple[FunctionMeta, Calls]]:
    """Steady traffic at rates spread geometrically from one call per 10 minutes to 3 a second."""
    out = []
    for i in range(n):
        rate = (1 / 600) * (1800 ** (i / max(n - 1, 1))) * _log_uniform(rng, 0.8, 1.25)
        errors = rng.choice((0.0, 0.0, 0.005))
        out.append((_meta(rng, f"{prefix}-{i}"), _poisson(rng, span_ms, lambda t, r=rate: r, rate, _runs(rng), errors)))
    return out


def bursts(rng: random.Random, n: int, span_ms: int, prefix: str = "burst") -> list[tuple[FunctionMeta, Calls]]:
    """On/off: a burst of tens of calls within a few seconds, then minutes of nothing."""
    out = []
    for i in range(n):
        size, within_ms = rng.randint(40, 120), rng.uniform(2_000, 8_000)
        pause_ms = rng.uniform(4, 15) * 60_000
        run = _runs(rng, 20, 3_000)
        calls: Calls = []
        t = rng.uniform(0, pause_ms)
        while t < span_ms:
            count = max(1, round(size * rng.uniform(0.8, 1.2)))
            calls += [(round(t + rng.uniform(0, within_ms)), run(), 200) for _ in range(count)]
            t += within_ms + pause_ms * rng.uniform(0.8, 1.2)
        memory = rng.choice(MEMORY_MB[2:])  # the big ones: an overshoot costs most there
        out.append((_meta(rng, f"{prefix}-{i}", memory_mb=memory), [c for c in calls if c[0] < span_ms]))
    return out


def _triangle(low: float, peak: float, top_ms: float, width_ms: float) -> Callable[[float], float]:
    return lambda t: low + (peak - low) * max(0.0, 1 - abs(t - top_ms) / (width_ms / 2))


def ramps(rng: random.Random, n: int, span_ms: int, prefix: str = "ramp") -> list[tuple[FunctionMeta, Calls]]:
    """Traffic rising slowly from almost nothing to a peak and back: a triangle over 20-50 minutes."""
    out = []
    for i in range(n):
        peak, width = _log_uniform(rng, 0.2, 2), min(rng.uniform(20, 50) * 60_000, span_ms)
        rate = _triangle(0.002, peak, rng.uniform(width / 2, span_ms - width / 2), width)
        errors = rng.choice((0.0, 0.005))
        out.append((_meta(rng, f"{prefix}-{i}"), _poisson(rng, span_ms, rate, peak, _runs(rng), errors)))
    return out


def oneoffs(rng: random.Random, n: int, span_ms: int, prefix: str = "oneoff") -> list[tuple[FunctionMeta, Calls]]:
    """Functions called once to three times, anywhere in the hour."""
    out = []
    for i in range(n):
        run = _runs(rng)
        calls = sorted((rng.randrange(span_ms), run(), 200) for _ in range(rng.choice((1, 1, 2, 3))))
        out.append((_meta(rng, f"{prefix}-{i}"), calls))
    return out


Shape = Callable[[random.Random, int, int], list[tuple[FunctionMeta, Calls]]]
# Each shape with how many functions its own trace has, and how many the mixed one.
SHAPES: dict[str, tuple[Shape, int, int]] = {
    "timer": (timers, 8, 4),
    "poisson": (poissons, 10, 6),
    "burst": (bursts, 5, 3),
    "ramp": (ramps, 5, 3),
    "oneoff": (oneoffs, 40, 20),
}
TRACES = ("mixed", *SHAPES)


def generate(trace: str, seed: int = 0, span_ms: int = SPAN_MS) -> Dataset:
    """The trace named `trace` (`mixed` or a shape) for `seed`, as the dataset `gen-<trace>`.

    `span_ms`: a shorter trace, for a test that needs only a few minutes of each shape."""
    if trace not in TRACES:
        raise ValueError(f"unknown trace {trace!r}; choose one of {', '.join(TRACES)}")
    rng = random.Random(f"{seed}-{trace}")
    functions = []
    for name, (shape, alone, mixed) in SHAPES.items():
        if trace in (name, "mixed"):
            functions += shape(rng, alone if trace == name else mixed, span_ms)
    metas = {meta.key: meta for meta, _ in functions}
    requests = [
        Request(start_time=EPOCH_MS + t, meta_key=meta.key, durations_in_ms=run, status_code=status)
        for meta, calls in functions
        for t, run, status in calls
    ]
    requests.sort(key=lambda r: (r.start_time, r.meta_key))
    return Dataset(f"gen-{trace}", metas, requests)


def write(dataset: Dataset, folder: Path) -> Path:
    """The dataset as a folder in the challenge's format: `metas` and `requests`, JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    (folder / "metas").write_bytes(b"".join(encoder.encode(m) + b"\n" for m in dataset.metas.values()))
    (folder / "requests").write_bytes(b"".join(encoder.encode(r) + b"\n" for r in dataset.requests))
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, metavar="OUT_DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traces", nargs="+", default=list(TRACES), choices=TRACES, metavar="NAME")
    args = p.parse_args(argv)
    for trace in args.traces:
        dataset = generate(trace, args.seed)
        folder = write(dataset, args.out / dataset.name)
        print(f"{folder}: {plural(len(dataset.metas), 'function')}, {plural(len(dataset.requests), 'request')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
