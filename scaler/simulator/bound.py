"""The clairvoyant bound: how well a scaler that knew the whole trace in advance could score.

Every instance is warmed just in time, so no request waits (the cold-start half is its full 50).
Requests of a function go to the most recently freed instance (MRU), or to a new one when none
is free; a new instance costs CreateSlot + Init of slot time, and an idle gap on an instance
costs the cheaper of keeping it (the gap) or destroying it and warming a new one just in time
(CreateSlot + Init). An instance that served a request with a status other than 200 is not
reused: the simulator asks for it to be destroyed (need_destroy). It is a property of the
dataset, a yardstick for policies, not a strict optimum (MRU need not be the best matching).
"""

import heapq
from collections import defaultdict

import msgspec

from scaler.simulator.dataset import Dataset, Request


class Bound(msgspec.Struct, frozen=True):
    instances: int  # instances the bound starts
    execution_gb_s: float
    idle_gb_s: float  # slot time beyond executions: warm-ups and the idle gaps kept

    @property
    def slot_gb_s(self) -> float:
        return self.execution_gb_s + self.idle_gb_s

    @property
    def resource_usage_score(self) -> float:
        return 50 * self.execution_gb_s / self.slot_gb_s if self.slot_gb_s > 0 else 0.0

    @property
    def score(self) -> float:
        return 50 + self.resource_usage_score


def clairvoyant_bound(dataset: Dataset, create_latency_ms: int = 100) -> Bound:
    by_key: dict[str, list[Request]] = defaultdict(list)
    for r in dataset.requests:
        by_key[r.meta_key].append(r)
    instances = 0
    execution_ms_gb = idle_ms_gb = 0.0
    for key, requests in by_key.items():
        meta = dataset.metas[key]
        gb = meta.memory_in_mb / 1024
        warm_ms = create_latency_ms + meta.init_duration_in_ms
        busy: list[tuple[int, int, bool]] = []  # (free at, tie-break, reusable)
        free: list[int] = []  # when each free instance was freed, ascending: the last is the MRU
        for n, r in enumerate(requests):
            while busy and busy[0][0] <= r.start_time:
                freed_at, _, reusable = heapq.heappop(busy)
                if reusable:
                    free.append(freed_at)
            if free:
                idle_ms_gb += gb * min(r.start_time - free.pop(), warm_ms)
            else:
                instances += 1
                idle_ms_gb += gb * warm_ms
            execution_ms_gb += gb * r.durations_in_ms
            heapq.heappush(busy, (r.start_time + r.durations_in_ms, n, r.status_code == 200))
    return Bound(instances, execution_ms_gb / 1000, idle_ms_gb / 1000)
