"""What every conversion shares: a function as a trace gives it, the draws that fill in what the trace
lacks, the field's way of sampling functions, and writing the dataset.

Deterministic: each function draws from its own generator, seeded by the run's seed and its key, so a
function's requests are the same whether it is converted alone or in a sample of many.
"""

import bisect
import hashlib
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from scaler.simulator.dataset import FunctionMeta, Request

MINUTE_MS = 60_000
MEMORY_STEP_MB = 128  # memory drawn from percentiles is rounded up to this, as platforms size slots
DEFAULT_MEMORY_MB = 256  # when the trace says nothing of memory
DEFAULT_INIT_MS = 500  # when nothing says how long a start takes
MIN_TIMEOUT_S = 300  # Azure Functions' default timeout; longer when a request of the function runs longer


class TraceError(ValueError):
    """Bad trace input, said with its file (and line, when one is to blame)."""


@dataclass(frozen=True)
class Percentiles:
    """A distribution known by some of its percentiles: (q in 0..100, value), ascending in q."""

    points: tuple[tuple[float, float], ...]

    def draw(self, rng: random.Random) -> float:
        """Inverse-CDF sampling, linear between the known percentiles (uniform q in [first q, last q])."""
        qs = [q for q, _ in self.points]
        q = rng.uniform(qs[0], qs[-1])
        i = min(max(bisect.bisect_right(qs, q), 1), len(qs) - 1)
        (q0, v0), (q1, v1) = self.points[i - 1], self.points[i]
        return v0 if q1 == q0 else v0 + (v1 - v0) * (q - q0) / (q1 - q0)


@dataclass
class Function:
    """One function as its trace gives it, before its requests are made."""

    key: str
    invocations: int  # in the window: what sampling weighs
    # Its requests, (start ms from the trace's start, duration ms), drawn with the generator given.
    requests: Callable[[random.Random], list[tuple[int, int]]]
    memory_mb: int | None = None  # None: the trace has no memory for it
    init_ms: int | None = None  # None: the trace has no init time for it
    memory: Percentiles | None = None  # ... or a distribution to draw it from
    runtime: str = ""


def rng_for(seed: int, key: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def spread(counts: Iterable[tuple[int, int]], interval_ms: int, rng: random.Random) -> list[int]:
    """Arrival times from (interval start ms, count) pairs: each count's arrivals uniform within its
    interval, to the millisecond."""
    times: list[int] = []
    for start, count in counts:
        times += sorted(start + int(rng.random() * interval_ms) for _ in range(count))
    return times


def sample(functions: list[Function], n: int | None, seed: int) -> list[Function]:
    """N functions spanning the trace's popularity: sorted by invocations, cut into N strata of equal size,
    one drawn at random from each. None or N >= the functions: all of them."""
    functions = sorted((f for f in functions if f.invocations), key=lambda f: (f.invocations, f.key))
    if n is None or n >= len(functions):
        return functions
    rng = random.Random(seed)
    picked = []
    for k in range(n):
        lo, hi = k * len(functions) // n, (k + 1) * len(functions) // n
        picked.append(functions[rng.randrange(lo, hi)])
    return picked


def round_memory(mb: float) -> int:
    return max(MEMORY_STEP_MB, math.ceil(mb / MEMORY_STEP_MB) * MEMORY_STEP_MB)


class Inits(Protocol):
    """Where init times come from when the trace has none (scaler/traces/inits.py)."""

    def draw(self, rng: random.Random, memory_mb: int | None) -> tuple[int, int | None]:
        """An init (ms) for a function of that memory (None: not known), and a memory to give it, if any."""
        ...


@dataclass
class Fill:
    """What the conversion sets where the trace is silent."""

    memory_mb: int
    inits: Inits


@dataclass
class Converted:
    metas: list[FunctionMeta]
    requests: list[Request]
    filled: dict[str, int]  # what was filled in, counted: "memory (default)": 3, ...


def convert(functions: Sequence[Function], base_ms: int, seed: int, fill: Fill) -> Converted:
    """The dataset of these functions: their requests, and metas with what the trace lacks filled in."""
    metas, requests = [], []
    filled: dict[str, int] = {}

    def said(what: str) -> None:
        filled[what] = filled.get(what, 0) + 1

    for f in functions:
        rng = rng_for(seed, f.key)
        calls = f.requests(rng)
        if not calls:
            continue
        memory, init = f.memory_mb, f.init_ms
        if memory is None and f.memory is not None:
            memory = round_memory(f.memory.draw(rng))
            said("memory drawn from the trace's percentiles")
        if init is None:
            init, pod_mb = fill.inits.draw(rng_for(seed, f"{f.key}:init"), memory)
            if memory is None and pod_mb is not None:
                memory = pod_mb
                said("memory from the cold-start table's pod")
        if memory is None:
            memory = fill.memory_mb
            said("memory set to --memory-mb")
        longest_s = math.ceil(max(d for _, d in calls) / 1000)
        meta = FunctionMeta(f.key, memory, init, f.runtime, max(MIN_TIMEOUT_S, longest_s))
        metas.append(meta)
        requests += [Request(base_ms + start, f.key, duration) for start, duration in calls]
    requests.sort(key=lambda r: (r.start_time, r.meta_key))
    return Converted(metas, requests, filled)


def write(out: Path, converted: Converted) -> None:
    """`metas` and `requests`, JSON lines, in the folder `out` (made if need be)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        encoder = msgspec.json.Encoder()
        (out / "metas").write_bytes(b"".join(encoder.encode(m) + b"\n" for m in converted.metas))
        (out / "requests").write_bytes(b"".join(encoder.encode(r) + b"\n" for r in converted.requests))
    except OSError as e:
        raise TraceError(f"{out}: cannot write: {e.strerror}") from None
