"""Init times where a trace has none (`--init-from`): a distribution the user names, drawn once per function.

None of the traces we convert says how long a function takes to start, yet keep-alive and pre-warming
are judged on exactly that: one start time for every function judges every policy on one number.
The spec names where the numbers come from, and the import prints it:

- `MS`: every function starts in MS milliseconds (500 by default);
- `loguniform:LO-HI`: each function's init drawn log-uniformly between LO and HI ms;
- `huawei2025`: Huawei Cloud's cold starts of all five regions as the EuroSys'25 paper fits them
  (a LogNormal of mean 3.24 s and standard deviation 7.10 s, its Figure 10b);
- `huawei2025:PATH`: that release's own table of measured cold starts (one region's `R1`..`R5`, a
  CSV file or the folder of its day files): a start drawn among those of pods with the function's
  memory (the smallest pool at least as large), or, for a function whose trace gives no memory, among
  all of them, the pod's memory taken with it.

Each function draws from its own generator (the seed and its key), so its init does not move with the
window, the sample or the requests drawn. docs/traces.md says what each assumes.
"""

import argparse
import bisect
import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from scaler.traces import huawei
from scaler.traces.build import Inits

# Huawei 2025 (Joosen et al., "Serverless Cold Starts and Where to Find Them", EuroSys'25), Figure 10b:
# all regions' cold start times fit by a LogNormal "with mean 3.24 and standard deviation 7.10" (seconds).
HUAWEI_2025_MEAN_MS = 3240
HUAWEI_2025_SD_MS = 7100
SPECS = "MS, loguniform:LO-HI (ms), huawei2025, or huawei2025:PATH (a region's cold-start table)"


@dataclass(frozen=True)
class Constant:
    ms: int

    def draw(self, rng: random.Random, memory_mb: int | None) -> tuple[int, int | None]:
        return self.ms, None

    def __str__(self) -> str:
        return f"{self.ms} ms for every function (--init-from {self.ms}), an assumption: no trace gives one"


@dataclass(frozen=True)
class LogUniform:
    lo_ms: float
    hi_ms: float

    def draw(self, rng: random.Random, memory_mb: int | None) -> tuple[int, int | None]:
        return round(math.exp(rng.uniform(math.log(self.lo_ms), math.log(self.hi_ms)))), None

    def __str__(self) -> str:
        return f"drawn per function log-uniformly in {self.lo_ms:g}-{self.hi_ms:g} ms, an assumption"


@dataclass(frozen=True)
class LogNormal:
    """A LogNormal given by its own mean and standard deviation (not those of its logarithm)."""

    mean_ms: float
    sd_ms: float
    source: str

    def draw(self, rng: random.Random, memory_mb: int | None) -> tuple[int, int | None]:
        sigma2 = math.log(1 + (self.sd_ms / self.mean_ms) ** 2)
        return max(1, round(rng.lognormvariate(math.log(self.mean_ms) - sigma2 / 2, math.sqrt(sigma2)))), None

    def __str__(self) -> str:
        return f"drawn per function from {self.source}"


@dataclass
class ColdStartTable:
    """Measured cold starts (Huawei 2025's per-start table): start times by the memory of their pod."""

    path: Path
    starts: list[tuple[int, int | None]] = field(default_factory=list)  # (ms, the pod's MB or None)
    by_memory: dict[int, list[int]] = field(default_factory=dict)  # the starts of each pool's memory
    pools: list[int] = field(default_factory=list)  # the pools' memories, ascending

    def load(self) -> "ColdStartTable":
        self.starts = huawei.cold_starts(self.path)
        by_memory: dict[int, list[int]] = defaultdict(list)
        for ms, mb in self.starts:
            if mb is not None:
                by_memory[mb].append(ms)
        self.by_memory, self.pools = dict(by_memory), sorted(by_memory)
        return self

    def draw(self, rng: random.Random, memory_mb: int | None) -> tuple[int, int | None]:
        if memory_mb is None or not self.pools:
            return rng.choice(self.starts)
        pool = self.pools[min(bisect.bisect_left(self.pools, memory_mb), len(self.pools) - 1)]
        return rng.choice(self.by_memory[pool]), None

    def __str__(self) -> str:
        median = statistics.median(ms for ms, _ in self.starts) / 1000
        pools = ", ".join(f"{mb} MB" for mb in self.pools)
        return (
            f"drawn per function from {self.path.name}'s {len(self.starts):,} cold starts (Huawei 2025, median"
            f" {median:.2f} s), among the pods of the function's memory ({pools})"
        )


def named(text: str) -> Inits:
    """An argparse type: the distribution a spec names (a table is read later, by `load`)."""
    kind, _, arg = text.strip().partition(":")
    try:
        if kind.isdigit() and not arg:
            if int(kind) <= 0:
                raise ValueError
            return Constant(int(kind))
        if kind == "loguniform":
            lo, hi = (float(x) for x in arg.split("-"))
            if not 0 < lo < hi < math.inf:
                raise ValueError
            return LogUniform(lo, hi)
        if kind == "huawei2025" and not arg:
            fit = "LogNormal, mean 3.24 s, sd 7.10 s; EuroSys'25, Figure 10b"
            return LogNormal(HUAWEI_2025_MEAN_MS, HUAWEI_2025_SD_MS, f"Huawei 2025's cold starts, all regions ({fit})")
        if kind == "huawei2025":
            return ColdStartTable(Path(arg))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"not an init distribution: {text!r} (one of {SPECS})")


def load(inits: Inits) -> Inits:
    """The distribution ready to draw from: a table read from its file (a TraceError when it cannot be)."""
    return inits.load() if isinstance(inits, ColdStartTable) else inits
