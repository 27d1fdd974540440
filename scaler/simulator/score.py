"""Statistics and score of a run, as the challenge reported them; both simulator modes end here.

Per dataset (see ../shared/datasets/README.md):
    resourceUsageScore = 50 * executionGBs / slotGBs
    coldStartScore     = 50 * executionSecs / (executionSecs + scheduleSecs + idleSecs)
    score              = resourceUsageScore + coldStartScore            (0..100)
and a run whose success rate is below 99.95 % scores 0. Schedule time runs from an Assign call
to its reply, idle time is the time spent in Idle calls, slot time is memory x time from
CreateSlot to DestroySlot, or to the end of the run (RUN_TAIL_MS after the last request's Idle).
invocationLatencyInSecs is schedule + execution + idle, summed over invocations.

Beside the score, the papers' metrics (docs/simulation.md says which paper each comes from):
    coldStartRate          = cold starts / invocations    (an invocation whose Assign waited for a start)
    wastedMemoryTimeInGBs  = slot GB·s - execution GB·s  (instances alive but not running a request)
    waitP50InMs, waitP99InMs, waitMaxInMs: the Assign's wait (schedule time) over every invocation

A request fails when one of its calls errors, or when the instance its Assign names is not one
the platform can run it on: unknown (no live slot runs it), not initialised yet, or held by
another request still running; and when its slot is destroyed before it finished, since no
execution happens without a slot. A failed request's execution does not count.
"""

import enum
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import msgspec
from msgspec.structs import replace

SUCCESS_THRESHOLD = 0.9995  # below this success rate the run scores 0
# The end of the run, after the last request's Idle. The challenge's simulator stopped some time
# after the trace's last request: its demo scaler's function_smoke_test figure (26,476 slot GB·s
# with 5-minute keep-alives, so no slot destroyed before the end) is reached, with both our
# offline `demo` and a model of the Go starter's one-slot-per-cold-start, 19.9-21 s after the
# last Idle. Slots still alive are charged until then, and those the scaler destroys meanwhile
# only until their DestroySlot.
RUN_TAIL_MS = 20_000


class Failure(enum.StrEnum):
    """Why a request failed, as the statistics name it."""

    ASSIGN_ERROR = "assignError"  # the Assign call returned an error
    IDLE_ERROR = "idleError"  # the Idle call returned an error
    UNKNOWN_INSTANCE = "unknownInstance"  # the Assign named an instance no live slot runs
    NOT_INITIALISED = "notInitialised"  # ... one whose Init had not finished
    HELD = "heldByAnother"  # ... one another request was still running on
    SLOT_LOST = "slotLost"  # the slot was destroyed while the request ran on it


class Invocation(msgspec.Struct, frozen=True):
    key: str
    memory_mb: int
    execution_ms: int  # the trace's durationsInMs
    schedule_ms: float
    idle_ms: float
    cold: bool  # its Assign waited for an instance being created
    failure: Failure | None = None  # the first thing that went wrong, if any

    @property
    def failed(self) -> bool:
        return self.failure is not None


class Stats(msgspec.Struct, frozen=True, rename="camel"):
    total_requests_count: int
    failed_requests_count: int
    failures_by_cause: dict[str, int]  # every Failure, in its order, zeros included
    success_rate: float
    invocation_latency_in_secs: float
    invocation_execution_time_in_secs: float
    invocation_execution_time_in_g_bs: float
    invocation_schedule_time_in_secs: float
    invocation_idle_time_in_secs: float
    total_slot_time_in_g_bs: float
    total_live_slot_count: int  # slots created over the run
    cold_starts: int
    resource_usage_score: float
    cold_start_score: float
    score: float  # their sum, or 0 when the success rate is below SUCCESS_THRESHOLD
    # The papers' metrics (defaults: runs saved before they were measured still load).
    cold_start_rate: float = 0.0  # cold_starts / total_requests_count
    wasted_memory_time_in_g_bs: float = 0.0  # slot GB·s not spent executing: idle, starting or retiring
    wait_p50_in_ms: float = 0.0  # the Assign's wait (schedule time), over every invocation
    wait_p99_in_ms: float = 0.0
    wait_max_in_ms: float = 0.0


class FunctionRow(msgspec.Struct, frozen=True, rename="camel"):
    key: str
    requests: int
    cold_starts: int
    schedule_secs: float
    execution_g_bs: float
    slot_g_bs: float
    lost_score: float  # how much this function costs the run's score (both halves)
    idle_secs: float = 0.0  # time spent in its Idle calls
    wait_p50_ms: float = 0.0  # its requests' waits (schedule time)
    wait_p99_ms: float = 0.0
    wait_max_ms: float = 0.0

    @property
    def wasted_g_bs(self) -> float:
        """Slot GB·s beyond its executions: what its instances cost while not running its requests."""
        return max(self.slot_g_bs - self.execution_g_bs, 0.0)

    @property
    def cold_start_rate(self) -> float:
        return self.cold_starts / self.requests if self.requests else 0.0

    def lost_against(self, totals: "Stats") -> float:
        """The points it costs a run with these totals: its wasted GB·s over their slot GB·s, times 50, plus
        its schedule and idle time over their latency, times 50. Against one run's totals, two runs' rows
        compare; each against its own, they do not (a run that wastes less overall makes each waste weigh more).
        """
        lost = 0.0
        if totals.total_slot_time_in_g_bs > 0:
            lost += 50 * self.wasted_g_bs / totals.total_slot_time_in_g_bs
        if totals.invocation_latency_in_secs > 0:
            lost += 50 * (self.schedule_secs + self.idle_secs) / totals.invocation_latency_in_secs
        return lost


def _gb_s(memory_mb: int, ms: float) -> float:
    return memory_mb / 1024 * ms / 1000


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of sorted values: one of them, never an interpolation."""
    if not values:
        return 0.0
    return float(values[max(math.ceil(q / 100 * len(values)), 1) - 1])


def waits(invocations: list[Invocation]) -> tuple[float, float, float]:
    """p50, p99 and max of the invocations' schedule time, in ms."""
    ms = sorted(i.schedule_ms for i in invocations)
    return percentile(ms, 50), percentile(ms, 99), float(ms[-1]) if ms else 0.0


def summarize(invocations: list[Invocation], slot_gb_s: float, slots_created: int) -> Stats:
    ok = [i for i in invocations if not i.failed]
    exec_s = sum(i.execution_ms for i in ok) / 1000
    exec_gb_s = sum(_gb_s(i.memory_mb, i.execution_ms) for i in ok)
    schedule_s = sum(i.schedule_ms for i in invocations) / 1000
    idle_s = sum(i.idle_ms for i in invocations) / 1000
    resource = 50 * exec_gb_s / slot_gb_s if slot_gb_s > 0 else 0.0
    waiting = exec_s + schedule_s + idle_s
    cold_score = 50 * exec_s / waiting if waiting > 0 else 0.0
    n = len(invocations)
    success = len(ok) / n if n else 0.0
    causes = Counter(i.failure for i in invocations if i.failure is not None)
    cold = sum(i.cold for i in invocations)
    p50, p99, longest = waits(invocations)
    return Stats(
        total_requests_count=n,
        failed_requests_count=n - len(ok),
        failures_by_cause={str(f): causes[f] for f in Failure},
        success_rate=success,
        invocation_latency_in_secs=waiting,
        invocation_execution_time_in_secs=exec_s,
        invocation_execution_time_in_g_bs=exec_gb_s,
        invocation_schedule_time_in_secs=schedule_s,
        invocation_idle_time_in_secs=idle_s,
        total_slot_time_in_g_bs=slot_gb_s,
        total_live_slot_count=slots_created,
        cold_starts=cold,
        resource_usage_score=resource,
        cold_start_score=cold_score,
        score=resource + cold_score if success >= SUCCESS_THRESHOLD else 0.0,
        cold_start_rate=cold / n if n else 0.0,
        wasted_memory_time_in_g_bs=max(slot_gb_s - exec_gb_s, 0.0),
        wait_p50_in_ms=p50,
        wait_p99_in_ms=p99,
        wait_max_in_ms=longest,
    )


def worst_functions(
    invocations: list[Invocation], slot_gb_s_by_key: dict[str, float], stats: Stats, top: int = 10
) -> list[FunctionRow]:
    """The functions that cost the score most: idle slot memory beyond their execution, and waiting.

    A function's lost score is its share of each half's shortfall: wasted GB·s over the run's
    slot GB·s times the resource half's 50, plus its schedule and idle time over the run's
    latency times the cold-start half's 50.
    """
    by_key: dict[str, list[Invocation]] = defaultdict(list)
    for i in invocations:
        by_key[i.key].append(i)
    rows = []
    for key, calls in by_key.items():
        p50, p99, longest = waits(calls)
        row = FunctionRow(
            key=key,
            requests=len(calls),
            cold_starts=sum(i.cold for i in calls),
            schedule_secs=sum(i.schedule_ms for i in calls) / 1000,
            execution_g_bs=sum(_gb_s(i.memory_mb, i.execution_ms) for i in calls if not i.failed),
            slot_g_bs=slot_gb_s_by_key.get(key, 0.0),
            lost_score=0.0,
            idle_secs=sum(i.idle_ms for i in calls) / 1000,
            wait_p50_ms=p50,
            wait_p99_ms=p99,
            wait_max_ms=longest,
        )
        rows.append(replace(row, lost_score=row.lost_against(stats)))
    rows.sort(key=lambda r: r.lost_score, reverse=True)
    return rows[:top]


class Run(msgspec.Struct):
    """What a simulation measured, in either mode."""

    invocations: list[Invocation]
    slot_gb_s: float
    slots_created: int
    slot_gb_s_by_key: dict[str, float]

    def stats(self) -> Stats:
        return summarize(self.invocations, self.slot_gb_s, self.slots_created)
