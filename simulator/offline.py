"""Offline mode: a discrete-event simulation on a virtual clock, running the controller's pure core.

No NATS and no gRPC: commands go straight to `decide`, and the platform is modelled as the stub
behaves (CreateSlot takes `create_latency_ms`, Init the function's initDurationInMs, DestroySlot
is immediate). What the live shell would do with a decision, this does too: SlotWanted starts a
creation, Assigned starts the request's execution (Idle follows after its duration), a retired
slot is destroyed, and the batch's next deadline arms a Tick, exactly as the gc worker would
(a deadline only travels in an appended batch, or the re-arm after a Tick). Deterministic, and
the scaler's own latency counts as zero.
"""

import heapq
import itertools
from dataclasses import dataclass, field

from controller.core.decide import decide
from controller.core.policy import Policy
from controller.core.state import FnState, Totals
from proto import commands as c
from proto import events as e
from simulator.dataset import Dataset
from simulator.score import Invocation, Run

# What can happen next, in the order the loop takes simultaneous things: a request's arrival
# comes after the Idle, readiness and Tick due at the same instant.
IDLE, READY, DESTROYED, TICK, ARRIVAL = range(5)


@dataclass
class Slot:
    key: str
    memory_mb: int
    created_ms: int
    ready_ms: int
    destroyed_ms: int | None = None


@dataclass
class Simulation:
    dataset: Dataset
    policy: Policy
    create_latency_ms: int = 100
    states: dict[str, FnState] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)  # the run so far, as the controller keeps it
    slots: dict[str, Slot] = field(default_factory=dict)  # by slot id (= the instance id here)
    arrival_ms: dict[str, int] = field(default_factory=dict)
    invocations: dict[str, Invocation] = field(default_factory=dict)
    deadlines: dict[str, int] = field(default_factory=dict)  # what the gc worker would hold
    _queue: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    def at(self, t: int, kind: int, item) -> None:
        heapq.heappush(self._queue, (t, kind, next(self._seq), item))

    def run(self) -> Run:
        start = self.dataset.start_ms
        for n, r in enumerate(self.dataset.requests):
            self.at(r.start_time - start, ARRIVAL, n)
        remaining = len(self.dataset.requests)
        now = 0
        while remaining and self._queue:
            now, kind, _, item = heapq.heappop(self._queue)
            if kind == TICK:
                key, due = item
                if self.deadlines.get(key) != due:
                    continue  # superseded
                del self.deadlines[key]
                self.command(c.Tick(key=key, due_ms=due), now)
            elif kind == ARRIVAL:
                self.arrive(item, now)
            else:
                if kind == IDLE:
                    remaining -= 1
                self.command(item, now)
        return self.result(now)

    def arrive(self, n: int, now: int) -> None:
        r = self.dataset.requests[n]
        m = self.dataset.metas[r.meta_key]
        meta = e.Meta(memory_mb=m.memory_in_mb, runtime=m.runtime, timeout_s=m.timeout_in_secs)
        self.arrival_ms[str(n)] = now
        self.command(c.Assign(key=r.meta_key, request_id=str(n), meta=meta), now)

    def command(self, cmd: c.AnyCommand, now: int) -> None:
        old = self.states.get(cmd.key)
        d = decide(old or FnState(key=cmd.key), cmd, now, self.policy, self.totals)
        self.totals = self.totals.change(old, d.state)
        self.states[cmd.key] = d.state
        for event in d.events:
            self.effect(cmd.key, event, now)
        if d.events or isinstance(cmd, c.Tick):  # only an appended batch tells the gc worker
            if d.wake_ms is None:
                self.deadlines.pop(cmd.key, None)
            elif self.deadlines.get(cmd.key) != d.wake_ms:
                self.deadlines[cmd.key] = d.wake_ms
                self.at(max(d.wake_ms, now), TICK, (cmd.key, d.wake_ms))

    def effect(self, key: str, event: e.Event, now: int) -> None:
        match event:
            case e.SlotWanted(instance_id=i, meta=meta):
                init_ms = self.dataset.metas[key].init_duration_in_ms
                ready = now + self.create_latency_ms + init_ms
                self.slots[i] = Slot(key, meta.memory_mb, now, ready)
                report = c.SlotReady(
                    key=key, instance_id=i, slot_id=i, create_ms=self.create_latency_ms, init_ms=init_ms
                )
                self.at(ready, READY, report)
            case e.Assigned(request_id=r, instance_id=i):
                request = self.dataset.requests[int(r)]
                slot = self.slots[i]
                self.invocations[r] = Invocation(
                    key=key,
                    memory_mb=slot.memory_mb,
                    execution_ms=request.durations_in_ms,
                    schedule_ms=now - self.arrival_ms[r],
                    idle_ms=0.0,
                    cold=slot.ready_ms > self.arrival_ms[r],
                )
                idle = c.Idle(
                    key=key,
                    request_id=r,
                    instance_id=i,
                    status_code=request.status_code,
                    duration_ms=request.durations_in_ms,
                    need_destroy=request.status_code != 200,
                )
                self.at(now + request.durations_in_ms, IDLE, idle)
            case e.RequestFailed(request_id=r):
                m = self.dataset.metas[key]
                request = self.dataset.requests[int(r)]
                self.invocations[r] = Invocation(
                    key, m.memory_in_mb, request.durations_in_ms, now - self.arrival_ms[r], 0.0, False, failed=True
                )
            case e.InstanceRetired(instance_id=i, slot_id=slot_id) if slot_id:
                self.slots[slot_id].destroyed_ms = now
                self.at(now, DESTROYED, c.SlotDestroyed(key=key, instance_id=i, slot_id=slot_id))

    def result(self, end_ms: int) -> Run:
        by_key: dict[str, float] = {}
        for slot in self.slots.values():
            end = end_ms if slot.destroyed_ms is None else slot.destroyed_ms
            by_key[slot.key] = by_key.get(slot.key, 0.0) + slot.memory_mb / 1024 * (end - slot.created_ms) / 1000
        invocations = [self.invocations[str(n)] for n in range(len(self.dataset.requests))]
        return Run(invocations, sum(by_key.values()), len(self.slots), by_key)


def simulate(dataset: Dataset, policy: Policy, create_latency_ms: int = 100) -> Run:
    return Simulation(dataset, policy, create_latency_ms).run()
