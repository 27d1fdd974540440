"""A function's life as a person wants to see it: its instances on a time axis, the requests that
waited, the keep-alives the policy chose and why; folded from its events.

One fold for every source of events: the offline simulator (the core's decisions as they are
made), `scaler replay` (the EVENTS stream) and a live run (the stream read back afterwards). The
result is plain data (`msgspec` structs), so a run can be saved as JSON and drawn again, or
beside another run.
"""

import msgspec

from scaler.controller.core.features import GAP_BINS, gap_bin
from scaler.controller.core.state import FnState, Phase
from scaler.proto.events import (
    Assigned,
    Event,
    FunctionSeen,
    InstanceCreated,
    InstanceDestroyed,
    InstanceReady,
    InstanceRetired,
    KeptAlive,
    Released,
    RequestArrived,
    RequestFailed,
    SlotWanted,
)


class Life(msgspec.Struct, kw_only=True):
    """One instance: wanted (CreateSlot asked), slot created (Init runs), ready, busy spells, gone."""

    id: str
    wanted_ms: int
    reason: str = ""  # why the policy started it
    for_request: str = ""  # the request whose miss started it; "" for a pre-warm
    created_ms: int = 0  # CreateSlot done: Init from here (0: not known)
    ready_ms: int = 0  # Init done (0: never ready)
    retired_ms: int = 0  # serves no more (0: not retired)
    retire_reason: str = ""
    gone_ms: int = 0  # destroyed (0: alive at the end)
    busy: list[tuple[int, int, str]] = []  # (assigned, released, request id); released 0 while running

    @property
    def cold(self) -> bool:
        return bool(self.for_request)


class Wait(msgspec.Struct, array_like=True):
    """A request that waited for an instance: from its arrival to its assignment."""

    request_id: str
    arrived_ms: int
    served_ms: int
    instance_id: str
    cold: bool  # it waited for an instance being started (not one busy with another request)


class Keep(msgspec.Struct, array_like=True):
    """A keep-alive decision: the instance idle at `at_ms` stays until `until_ms`."""

    at_ms: int
    instance_id: str
    until_ms: int
    why: str


class Step(msgspec.Struct, array_like=True):
    """One decision in words, as `scaler replay` tells it (replay pages only)."""

    at_ms: int
    seq: int
    text: str


class Timeline(msgspec.Struct, kw_only=True):
    """Everything drawn for one function."""

    key: str
    memory_mb: int = 0
    first_ms: int = 0
    last_ms: int = 0
    requests: int = 0
    failed: int = 0
    instances: list[Life] = []
    waits: list[Wait] = []
    keeps: list[Keep] = []
    gaps_seen: list[int] = []  # inter-arrival times over the whole run, counted per gap_bin
    gaps_learned: list[float] = []  # the policy's state at the end: its decayed gap histogram (gap_bin)
    steps: list[Step] = []

    def keep_alive_bins(self) -> list[int]:
        """The keep-alives chosen (until - decided), counted per gap_bin: against the gaps they bet on."""
        counts = [0] * GAP_BINS
        for k in self.keeps:
            counts[gap_bin(k.until_ms - k.at_ms)] += 1
        return counts


class Fold:
    """Builds a Timeline from a function's events, one at a time."""

    def __init__(self, key: str) -> None:
        self.t = Timeline(key=key, gaps_seen=[0] * GAP_BINS)
        self._lives: dict[str, Life] = {}
        self._arrived: dict[str, int] = {}  # requests queued, not yet assigned
        self._last_arrival = 0

    def event(self, e: Event) -> None:
        t = self.t
        t.first_ms = t.first_ms or e.at_ms
        t.last_ms = max(t.last_ms, e.at_ms)
        match e:
            case FunctionSeen(meta=m):
                t.memory_mb = m.memory_mb
            case RequestArrived(request_id=r, at_ms=at):
                t.requests += 1
                self._arrived[r] = at
                if self._last_arrival:
                    t.gaps_seen[gap_bin(at - self._last_arrival)] += 1
                self._last_arrival = at
            case SlotWanted(instance_id=i, for_request=r, reason=why, at_ms=at):
                life = Life(id=i, wanted_ms=at, reason=why, for_request=r)
                self._lives[i] = life
                t.instances.append(life)
            case InstanceCreated(instance_id=i, at_ms=at) if i in self._lives:
                self._lives[i].created_ms = at
            case InstanceReady(instance_id=i, init_ms=init, at_ms=at) if i in self._lives:
                life = self._lives[i]
                life.ready_ms = at
                life.created_ms = life.created_ms or at - init
            case Assigned(request_id=r, instance_id=i, at_ms=at):
                arrived = self._arrived.pop(r, at)
                life = self._lives.get(i)
                if life is not None:
                    life.busy.append((at, 0, r))
                if at > arrived:  # cold as the score counts it: the instance became ready after the arrival
                    cold = life is not None and life.ready_ms > arrived
                    t.waits.append(Wait(r, arrived, at, i, cold))
            case Released(instance_id=i, request_id=r, at_ms=at) if i in self._lives:
                busy = self._lives[i].busy
                if busy and busy[-1][2] == r and not busy[-1][1]:
                    busy[-1] = (busy[-1][0], at, r)
            case KeptAlive(instance_id=i, until_ms=until, why=why, at_ms=at):
                t.keeps.append(Keep(at, i, until, why))
            case InstanceRetired(instance_id=i, reason=why, at_ms=at) if i in self._lives:
                self._lives[i].retired_ms = at
                self._lives[i].retire_reason = why
            case InstanceDestroyed(instance_id=i, at_ms=at) if i in self._lives:
                self._lives[i].gone_ms = at
            case RequestFailed(request_id=r):
                t.failed += 1
                self._arrived.pop(r, None)

    def seed(self, s: FnState, at_ms: int) -> None:
        """Start from a state instead of the function's first event (a replay from a snapshot): its
        instances are drawn from `at_ms` on, what they did before being gone with the stream's start."""
        for i in s.instances.values():
            known = max(i.wanted_ms, at_ms)
            life = Life(id=i.id, wanted_ms=known, reason="alive at the snapshot", for_request=i.for_request)
            if i.phase is not Phase.CREATING:
                life.created_ms = life.ready_ms = known
            if i.phase is Phase.BUSY:
                life.busy.append((max(i.since_ms, known), 0, i.request_id))
            if i.phase is Phase.RETIRING:
                life.retired_ms = known
            self._lives[i.id] = life
            self.t.instances.append(life)
        self._arrived.update((p.request_id, p.since_ms) for p in s.queue)
        self.t.memory_mb = s.meta.memory_mb if s.meta else 0
        self.t.first_ms = at_ms

    def step(self, at_ms: int, seq: int, text: str) -> None:
        self.t.steps.append(Step(at_ms, seq, text))

    def done(self, gap_hist: tuple[float, ...] = ()) -> Timeline:
        """The timeline, with the gap histogram the policy's state ended with."""
        self.t.gaps_learned = list(gap_hist)
        return self.t


class Folds:
    """Timelines of many functions, from events of any of them."""

    def __init__(self) -> None:
        self.by_key: dict[str, Fold] = {}

    def event(self, key: str, e: Event) -> None:
        fold = self.by_key.get(key)
        if fold is None:
            fold = self.by_key[key] = Fold(key)
        fold.event(e)
