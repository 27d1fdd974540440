"""Offline mode: a discrete-event simulation on a virtual clock, running the controller's pure core.

No NATS and no gRPC: commands go straight to `decide`, and the platform is modelled as the stub
behaves (CreateSlot takes `create_latency_ms`, Init the function's initDurationInMs, DestroySlot
is immediate). Decisions go through the same ledger as the node's (scaler/controller/ledger.py), so
states, totals and deadlines follow the same rules; what the node's effects would do, this does
too: SlotWanted starts a creation, Assigned starts the request's execution (Idle follows after
its duration), a retired slot is destroyed, and the function's next deadline arms a Tick, as the
node's timers would. Deterministic, and the scaler's own latency counts as zero, unless a latency model
measured on a live run is given (`latency`, scaler/simulator/latency.py): then each call reaches the core
and its answer the platform that much later, each start is dispatched, run and reported that much later,
each destruction reaches the platform later, and each timer fires late, every delay drawn from the model
with a generator seeded by `seed`.

The platform's side is kept apart from the fold: each Assigned is checked against the slots
and who runs on them (`Holds`), an Idle the core refuses fails its request, and the run ends
RUN_TAIL_MS after the last request's Idle, with the Ticks and destructions due until then.
"""

import heapq
import itertools
from dataclasses import dataclass, field

from msgspec.structs import replace

from scaler.controller.core.decide import Decision
from scaler.controller.core.policy import Policy
from scaler.controller.core.totals import Totals
from scaler.controller.ledger import Ledger, came_back
from scaler.proto import commands as c
from scaler.proto import events as e
from scaler.proto.events import Batch
from scaler.proto.subjects import partition
from scaler.report.timeline import Folds
from scaler.simulator.dataset import Dataset
from scaler.simulator.holds import Holds
from scaler.simulator.latency import Latency, Sampler
from scaler.simulator.progress import Progress
from scaler.simulator.score import RUN_TAIL_MS, Failure, Invocation, Run

SIMULATOR = "simulator"  # the reply_to of our Idle calls, so the core's answer says whether it took them

# What can happen next, in the order the loop takes simultaneous things: a request's arrival
# comes after the Idle, readiness and Tick due at the same instant. With a latency model, a call's
# answer reaching the platform (ANSWERED) and an Idle reaching the core (IDLE_IN) come apart from
# the call; without one they happen within it.
IDLE, READY, DESTROYED, TICK, ARRIVAL, SHARE, ANSWERED, IDLE_IN = range(8)


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
    tail_ms: int = RUN_TAIL_MS
    ledger: Ledger = field(default_factory=Ledger)
    # Nodes sharing the partitions, each with its own ledger and so its own run-wide totals (what the
    # learned policy's exchange rate is taken from): 1 is one node holding every partition.
    nodes: int = 1
    # how often the nodes tell each other their totals (0: never), as scaler/controller/shared.py
    share_every_ms: int = 0
    # the live scaler's own latency (None: none, the core's answers are instant), drawn with `seed`
    latency: Latency | None = None
    seed: int = 0
    ledgers: list[Ledger] = field(default_factory=list)
    slots: dict[str, Slot] = field(default_factory=dict)  # by slot id (= the instance id here)
    arrival_ms: dict[str, int] = field(default_factory=dict)
    invocations: dict[str, Invocation] = field(default_factory=dict)
    holds: Holds = field(default_factory=Holds)
    progress: Progress | None = None
    folds: Folds | None = None  # the functions' timelines, folded from every decision's events (for a report)
    end_ms: int = 0  # the end of the run, once run
    unanswered: int = 0  # requests with neither an Idle nor a failure yet
    _queue: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)
    _appended: itertools.count = field(default_factory=lambda: itertools.count(1))  # stands for stream sequences

    def __post_init__(self) -> None:
        self.ledgers = [self.ledger, *(Ledger() for _ in range(self.nodes - 1))]
        self.delays = Sampler(self.latency, self.seed) if self.latency is not None else None
        self.idle_ms: dict[str, int] = {}  # with a latency model: each request's Idle call, in and out

    def delay(self, part: str) -> int:
        """A delay the live scaler's own work adds here (scaler/simulator/latency.py); 0 without a model."""
        return self.delays.draw(part) if self.delays is not None else 0

    def ledger_of(self, key: str) -> Ledger:
        return self.ledgers[partition(key) % self.nodes]

    def at(self, t: int, kind: int, item) -> None:
        heapq.heappush(self._queue, (t, kind, next(self._seq), item))

    def run(self) -> Run:
        start = self.dataset.start_ms
        for n, r in enumerate(self.dataset.requests):
            self.at(r.start_time - start, ARRIVAL, n)
        if self.nodes > 1 and self.share_every_ms:
            self.at(0, SHARE, None)
        self.unanswered = len(self.dataset.requests)
        now, end = 0, None
        steps = itertools.count()
        while self._queue and (end is None or self._queue[0][0] <= end):
            now, kind, _, item = heapq.heappop(self._queue)
            if self.progress is not None and not next(steps) % 4096:
                self.progress.show(len(self.dataset.requests) - self.unanswered, now)
            if kind == TICK:
                key, due = item
                if self.ledger_of(key).wake.get(key) != due:
                    continue  # superseded
                self.command(c.Tick(key=key, due_ms=due), now)
            elif kind == ARRIVAL:
                self.arrive(item, now)
            elif kind == IDLE:
                self.idle(item, now)
            elif kind == IDLE_IN:
                self.idle_in(item, now)
            elif kind == ANSWERED:
                self.answered(*item, now)
            elif kind == SHARE:
                self.share()
                self.at(now + self.share_every_ms, SHARE, None)
            else:
                self.command(item, now)
            if end is None and not self.unanswered:
                end = now + self.tail_ms
        if self.progress is not None:
            self.progress.show(len(self.dataset.requests) - self.unanswered, now, final=True)
        self.end_ms = now if end is None else end
        return self.result(self.end_ms)

    def share(self) -> None:
        """Each node hears the others' totals."""
        for ledger in self.ledgers:
            others = Totals()
            for other in self.ledgers:
                if other is not ledger:
                    others = others.plus(other.totals)
            ledger.others = others

    def arrive(self, n: int | c.Assign, now: int) -> None:
        """The platform calls Assign (`n`, the request's index), which reaches the core now, or with a latency
        model once its time in (assign_in) has passed (the Assign itself)."""
        if isinstance(n, c.Assign):
            self.command(n, now)
            return
        r = self.dataset.requests[n]
        m = self.dataset.metas[r.meta_key]
        meta = e.Meta(memory_mb=m.memory_in_mb, runtime=m.runtime, timeout_s=m.timeout_in_secs)
        self.arrival_ms[str(n)] = now
        assign = c.Assign(key=r.meta_key, request_id=str(n), meta=meta)
        if into := self.delay("assign_in"):
            self.at(now + into, ARRIVAL, assign)
        else:
            self.command(assign, now)

    def command(self, cmd: c.AnyCommand, now: int) -> Decision:
        """The command's response and the plan after it, as one decision at rest."""
        ledger = self.ledger_of(cmd.key)
        before = ledger.wake.get(cmd.key)
        d = ledger.decide(cmd, now, self.policy)
        ledger.commit(cmd, d, self._stored(ledger.batch(cmd, d, now)))
        planned = ledger.plan(cmd.key, now, self.policy)  # as the node plans once nothing else waits
        ledger.commit_plan(cmd.key, planned, self._stored(ledger.batch(None, planned, now)))
        for event in d.events + planned.events:
            self.effect(cmd.key, event, now)
            if self.folds is not None:
                self.folds.event(cmd.key, event)
        wake = ledger.wake.get(cmd.key)
        if wake is not None and wake != before:
            self.at(max(wake, now) + self.delay("timer"), TICK, (cmd.key, wake))
        cues = ledger.cues(d)  # as the node does: its followers on this node are cued, and the other nodes told
        if len(self.ledgers) > 1 and (back := came_back(d)):
            cues += [cue for other in self.ledgers if other is not ledger for cue in other.hear(cmd.key, back)]
        for cue in cues:
            self.command(cue, now)
        return Decision(d.events + planned.events, d.replies, planned.state, wake, planned.features)

    def _stored(self, batch: Batch | None) -> int | None:
        """The stream sequence a batch would get (None: nothing to store)."""
        return next(self._appended) if batch is not None else None

    def effect(self, key: str, event: e.Event, now: int) -> None:
        match event:
            case e.SlotWanted(instance_id=i, meta=meta):
                init_ms = self.dataset.metas[key].init_duration_in_ms
                created = now + self.delay("dispatch")
                ready = created + self.create_latency_ms + init_ms + self.delay("start_extra")
                self.slots[i] = Slot(key, meta.memory_mb, created, ready)
                report = c.SlotReady(
                    key=key, instance_id=i, slot_id=i, create_ms=self.create_latency_ms, init_ms=init_ms
                )
                self.at(ready + self.delay("notify"), READY, report)
            case e.Assigned(request_id=r, instance_id=i):
                if out := self.delay("assign_out"):
                    self.at(now + out, ANSWERED, (key, r, i))
                else:
                    self.assigned(key, r, i, now)
            case e.RequestFailed(request_id=r):
                if out := self.delay("assign_out"):
                    self.at(now + out, ANSWERED, (key, r, ""))
                else:
                    self.answered(key, r, "", now)
            case e.InstanceRetired(instance_id=i, slot_id=slot_id) if slot_id:
                gone = now + self.delay("destroy")
                self.slots[slot_id].destroyed_ms = gone
                self.at(gone, DESTROYED, c.SlotDestroyed(key=key, instance_id=i, slot_id=slot_id))

    def answered(self, key: str, r: str, i: str, now: int) -> None:
        """The platform holds the core's answer to request `r`: instance `i`, or a failure (no instance)."""
        if i:
            self.assigned(key, r, i, now)
            return
        m = self.dataset.metas[key]
        request = self.dataset.requests[int(r)]
        schedule_ms = now - self.arrival_ms[r]
        invocation = Invocation(key, m.memory_in_mb, request.durations_in_ms, schedule_ms, 0.0, False)
        self.invocations[r] = replace(invocation, failure=Failure.ASSIGN_ERROR)
        self.unanswered -= 1

    # The platform's side: what it checks of an assignment and of an execution's end.

    def assigned(self, key: str, r: str, i: str, now: int) -> None:
        """The request runs on the instance for its duration, then calls Idle; or fails at once."""
        request = self.dataset.requests[int(r)]
        slot = self.slots.get(i)
        live = slot is not None and (slot.destroyed_ms is None or slot.destroyed_ms > now)
        failure = self.holds.assign(i, r, live=live, ready=live and slot.ready_ms <= now)
        self.invocations[r] = Invocation(
            key=key,
            memory_mb=self.dataset.metas[key].memory_in_mb,
            execution_ms=request.durations_in_ms,
            schedule_ms=now - self.arrival_ms[r],
            idle_ms=0.0,
            cold=slot is not None and slot.ready_ms > self.arrival_ms[r],
            failure=failure,
        )
        idle = c.Idle(
            key=key,
            request_id=r,
            instance_id=i,
            status_code=request.status_code,
            duration_ms=request.durations_in_ms,
            need_destroy=request.status_code != 200,
            reply_to=SIMULATOR,
        )
        self.at(now if failure else now + request.durations_in_ms, IDLE, idle)

    def idle(self, idle: c.Idle, now: int) -> None:
        """The request's execution ended and the platform calls Idle: it reaches the core now, or with a latency
        model once its time in (idle_in) has passed; the call lasts that and its time out (idle_out)."""
        r = idle.request_id
        invocation = self.invocations[r]
        if not invocation.failed:
            slot = self.slots[idle.instance_id]
            # the slot may be destroyed by now without the platform knowing yet (a model's destroy delay)
            live = slot.destroyed_ms is None or slot.destroyed_ms > now
            self._fail(r, self.holds.finish(idle.instance_id, r, live=live))
        if self.delays is None:
            self.idle_in(idle, now)
            return
        into = self.delay("idle_in")
        self.idle_ms[r] = into + self.delay("idle_out")
        if into:
            self.at(now + into, IDLE_IN, idle)
        else:
            self.idle_in(idle, now)

    def idle_in(self, idle: c.Idle, now: int) -> None:
        """The core takes the Idle; one it refuses fails its request."""
        r = idle.request_id
        refused = any(reply.code != c.Code.OK for reply in self.command(idle, now).replies)
        if refused and not self.invocations[r].failed:
            self._fail(r, Failure.IDLE_ERROR)
        if r in self.idle_ms:
            self.invocations[r] = replace(self.invocations[r], idle_ms=float(self.idle_ms.pop(r)))
        self.unanswered -= 1

    def _fail(self, r: str, failure: Failure | None) -> Invocation:
        if failure is not None:
            self.invocations[r] = replace(self.invocations[r], failure=failure)
        return self.invocations[r]

    def result(self, end_ms: int) -> Run:
        by_key: dict[str, float] = {}
        for slot in self.slots.values():
            end = end_ms if slot.destroyed_ms is None else slot.destroyed_ms
            by_key[slot.key] = by_key.get(slot.key, 0.0) + slot.memory_mb / 1024 * (end - slot.created_ms) / 1000
        invocations = [
            self.invocations.get(str(n)) or self._unanswered(n, end_ms) for n in range(len(self.dataset.requests))
        ]
        return Run(invocations, sum(by_key.values()), len(self.slots), by_key)

    def _unanswered(self, n: int, end_ms: int) -> Invocation:
        """A request the core never answered: its Assign failed, having waited until the end."""
        r = self.dataset.requests[n]
        memory = self.dataset.metas[r.meta_key].memory_in_mb
        schedule_ms = end_ms - self.arrival_ms.get(str(n), end_ms)
        return Invocation(r.meta_key, memory, r.durations_in_ms, schedule_ms, 0.0, False, Failure.ASSIGN_ERROR)


def simulate(
    dataset: Dataset,
    policy: Policy,
    create_latency_ms: int = 100,
    tail_ms: int = RUN_TAIL_MS,
    progress: Progress | None = None,
    latency: Latency | None = None,
    seed: int = 0,
) -> Run:
    return Simulation(dataset, policy, create_latency_ms, tail_ms, progress=progress, latency=latency, seed=seed).run()
