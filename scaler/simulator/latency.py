"""The time a live scaler's own work takes, as distributions, so that an offline run can be played on it.

Offline, the core decides the moment a call comes and its answer reaches the platform the same moment; a
live scaler takes time to decide, store and answer, its timers fire late, and its starts take longer than
the platform's CreateSlot and Init. `Latency` holds each of those times as a distribution (its percentiles),
measured on a live run (`measure`: the driver's record of every call, the platform's record of every slot,
and the node's own EVENTS stream, all on the one clock of a speed-1 run); `scaler simulate --offline
--latency FILE` plays a trace with them (scaler/simulator/offline.py: each delay drawn independently, from a
seeded generator, so a run is the same every time).

What each part is, in the run's clock (ms):
- assign_in: the platform's Assign call to the core's decision on it (RequestArrived);
- assign_out: the core's assignment (Assigned) to the platform holding the answer (its store and reply);
- idle_in, idle_out: the same for an Idle (Released);
- dispatch: the core's SlotWanted to the platform's CreateSlot (the store, the platform worker, the call);
- start_extra: the platform's CreateSlot to its Init's end, beyond their nominal lengths;
- notify: the Init's end to the core's InstanceReady (the worker's report, its decision);
- destroy: the core's InstanceRetired to the platform's DestroySlot;
- timer: how late a function's timer fired (a Tick's decision after its due time).

What it leaves out: each delay is drawn alone, so a burst that slows every call at once is played as
calls slowed at random; a node's latency that depends on the load it is given (more instances, more
decisions) is played at the load it was measured under.
"""

import asyncio
import itertools
import random
from collections.abc import Iterable
from pathlib import Path

import msgspec

from scaler.controller.ledger import PLAN
from scaler.proto import events as e
from scaler.proto.events import Batch

PARTS = (
    "assign_in",
    "assign_out",
    "idle_in",
    "idle_out",
    "dispatch",
    "start_extra",
    "notify",
    "destroy",
    "timer",
)
QUANTILES = 100  # a part is kept as its percentiles 0..100


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """Each part's distribution (ms) as its percentiles 0..100 (empty: not measured, taken as 0), with how many
    samples it was measured on, and what it was measured on."""

    source: str = ""
    assign_in: tuple[float, ...] = ()
    assign_out: tuple[float, ...] = ()
    idle_in: tuple[float, ...] = ()
    idle_out: tuple[float, ...] = ()
    dispatch: tuple[float, ...] = ()
    start_extra: tuple[float, ...] = ()
    notify: tuple[float, ...] = ()
    destroy: tuple[float, ...] = ()
    timer: tuple[float, ...] = ()
    samples: dict[str, int] = {}

    def mean(self, part: str) -> float:
        """The part's mean (over its percentiles' trapezoids), 0 when not measured."""
        q = getattr(self, part)
        if not q:
            return 0.0
        return sum((a + b) / 2 for a, b in itertools.pairwise(q)) / (len(q) - 1)

    def rows(self) -> list[str]:
        """A line per part: its samples, p50, p99 and mean."""
        out = []
        for part in PARTS:
            q = getattr(self, part)
            n = self.samples.get(part, 0)
            if q:
                mean = self.mean(part)
                out.append(f"{part:<12} {n:>7,} samples  p50 {q[50]:7.1f} ms  p99 {q[99]:7.1f} ms  mean {mean:7.1f} ms")
            else:
                out.append(f"{part:<12} {n:>7,} samples  (taken as 0)")
        return out


def percentiles(values: Iterable[float]) -> tuple[float, ...]:
    """The values' percentiles 0..100 (linear between order statistics); empty for no values."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return ()
    out = []
    for k in range(QUANTILES + 1):
        x = k / QUANTILES * (n - 1)
        i = int(x)
        out.append(ordered[i] if i + 1 >= n else ordered[i] + (ordered[i + 1] - ordered[i]) * (x - i))
    return tuple(round(v, 3) for v in out)


class Sampler:
    """Draws each part's delay (ms, an int, never below 0) from a model, from a generator seeded once: the same
    model and seed give the same draws in the same order."""

    def __init__(self, latency: Latency, seed: int = 0) -> None:
        self.latency = latency
        self._random = random.Random(seed)
        self._parts = {part: getattr(latency, part) for part in PARTS}

    def draw(self, part: str) -> int:
        q = self._parts[part]
        if not q:
            return 0
        x = self._random.random() * (len(q) - 1)
        i = int(x)
        value = q[i] if i + 1 >= len(q) else q[i] + (q[i + 1] - q[i]) * (x - i)
        return max(0, round(value))


def load(path: str | Path) -> Latency:
    """A model written by `dump` (`scaler simulate --latency-out`); ValueError saying why it cannot be read."""
    path = Path(path)
    try:
        return msgspec.json.decode(path.read_bytes(), type=Latency)
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror}") from None
    except msgspec.DecodeError as err:
        raise ValueError(f"{path}: not a latency model: {err}") from None


def dump(latency: Latency, path: str | Path) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(latency), indent=1) + b"\n")


class CallTimes(msgspec.Struct, frozen=True):
    """One request as the platform saw it (the live driver's record), in the run's clock."""

    request_id: str
    assign_start: int
    assign_end: int
    idle_start: int
    idle_end: int
    instance_id: str = ""


class SlotTimes(msgspec.Struct, frozen=True):
    """One slot as the platform saw it, in the run's clock, with its CreateSlot and Init's nominal lengths."""

    instance_id: str
    created_ms: int
    ready_ms: int
    destroyed_ms: int | None
    nominal_ms: int


def measure(
    calls: Iterable[CallTimes], slots: Iterable[SlotTimes], batches: Iterable[Batch] | None, source: str
) -> Latency:
    """The model of a live run at speed 1: the platform's side (`calls`, `slots`) against the core's (the node's
    EVENTS, `batches`, each decision as stored), every time on the run's one clock. Without the core's side (a
    scaler that keeps no events, `batches` None), from the platform's alone (`from_records`)."""
    if batches is None:
        return from_records(list(calls), list(slots), source)
    arrived: dict[str, int] = {}
    assigned: dict[str, int] = {}
    released: dict[str, int] = {}
    wanted: dict[str, int] = {}
    ready: dict[str, int] = {}
    retired: dict[str, int] = {}
    timer: list[float] = []
    before: dict[str, Batch] = {}  # each function's decision before
    for stored in batches:
        for batch in stored.decisions():
            last = before.get(batch.key)
            before[batch.key] = batch
            # A Tick changes nothing by itself, so what its timer brought is the plan stored after it: a plan
            # with no command's decision between it and a deadline passed (a Tick's own decision, when stored,
            # names its due time).
            if batch.cause.startswith("tick:"):
                timer.append(max(0, batch.at_ms - int(batch.cause.rsplit(":", 1)[1])))
            elif batch.cause == PLAN and last is not None and last.wake_ms is not None:
                if last.at_ms < last.wake_ms <= batch.at_ms:
                    timer.append(batch.at_ms - last.wake_ms)
            for ev in batch.events:
                match ev:
                    case e.RequestArrived(request_id=r, at_ms=t):
                        arrived.setdefault(r, t)
                    case e.Assigned(request_id=r, at_ms=t):
                        assigned[r] = t
                    case e.Released(request_id=r, at_ms=t, cancelled=False):
                        released.setdefault(r, t)
                    case e.SlotWanted(instance_id=i, at_ms=t):
                        wanted[i] = t
                    case e.InstanceReady(instance_id=i, at_ms=t):
                        ready[i] = t
                    case e.InstanceRetired(instance_id=i, at_ms=t):
                        retired.setdefault(i, t)
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    parts["timer"] = timer
    for c in calls:
        r = c.request_id
        if r in arrived:
            parts["assign_in"].append(max(0, arrived[r] - c.assign_start))
        if r in assigned and c.assign_end:
            parts["assign_out"].append(max(0, c.assign_end - assigned[r]))
        if r in released and c.idle_start:
            parts["idle_in"].append(max(0, released[r] - c.idle_start))
            parts["idle_out"].append(max(0, c.idle_end - released[r]))
    for s in slots:
        i = s.instance_id
        if i in wanted:
            parts["dispatch"].append(max(0, s.created_ms - wanted[i]))
        if s.ready_ms:
            parts["start_extra"].append(max(0, s.ready_ms - s.created_ms - s.nominal_ms))
            if i in ready:
                parts["notify"].append(max(0, ready[i] - s.ready_ms))
        if i in retired and s.destroyed_ms is not None:
            parts["destroy"].append(max(0, s.destroyed_ms - retired[i]))
    return Latency(
        source=source,
        samples={part: len(values) for part, values in parts.items()},
        **{part: percentiles(values) for part, values in parts.items()},
    )


async def read_batches(url: str, timeout_s: float = 30.0) -> list[Batch]:
    """Every batch of the EVENTS stream of the NATS at `url`, in order."""
    from scaler.runtime.bus import connected
    from scaler.store import stream

    batches: list[Batch] = []
    async with asyncio.timeout(timeout_s), connected(url, "latency") as nc:
        await stream.read(nc.jetstream(), lambda seq, batch: batches.append(batch))
    return batches


def from_records(calls: list[CallTimes], slots: list[SlotTimes], source: str) -> Latency:
    """The model of a scaler whose decisions cannot be read, from what the platform saw alone: a call answered by
    an instance ready before it came takes all its time on the way out (assign_out), an Idle all of it on the way
    in (its answer follows the decision); a call whose instance was created after it came waited for that
    CreateSlot (dispatch), and for its answer once the Init was done (notify), less a warm call's median way out.
    Timers and destructions are not seen: 0."""
    by_instance = {s.instance_id: s for s in slots}
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    cold: list[tuple[CallTimes, SlotTimes]] = []
    for c in calls:
        slot = by_instance.get(c.instance_id)
        if slot is None or not c.assign_end:
            continue
        if slot.ready_ms and slot.ready_ms <= c.assign_start:
            parts["assign_out"].append(c.assign_end - c.assign_start)
        elif slot.created_ms >= c.assign_start:
            cold.append((c, slot))
        if c.idle_start:
            parts["idle_in"].append(c.idle_end - c.idle_start)
    out = sorted(parts["assign_out"])
    way_out = out[len(out) // 2] if out else 0
    for c, slot in cold:
        parts["dispatch"].append(slot.created_ms - c.assign_start)
        parts["notify"].append(max(0, c.assign_end - slot.ready_ms - way_out))
    for s in slots:
        if s.ready_ms:
            parts["start_extra"].append(max(0, s.ready_ms - s.created_ms - s.nominal_ms))
    return Latency(
        source=f"{source} (the platform's side alone)",
        samples={part: len(values) for part, values in parts.items()},
        **{part: percentiles(values) for part, values in parts.items()},
    )
