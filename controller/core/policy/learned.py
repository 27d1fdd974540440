"""Our policy: learn each function from its own events, and weigh waiting against memory.

The challenge's score trades slot memory x time (GB·s) against time requests wait. Every choice
here goes through one exchange rate, `wait_gb`: the slot GB·s one second of waiting is worth.

- Pool size: while a function is active, keep the number of instances k that minimises
  memory x k + wait_gb x expected waiting (Erlang C on its recent arrival rate and run time).
  An instance beyond it retires when it goes idle.
- Lulls: how long after the last arrival to keep the pool, from a time-decayed histogram of the
  function's gaps (rare long gaps stay remembered): keep until T when the expected memory
  until the next arrival costs less than a miss. A miss costs the start time for the first
  request and for every request that arrives while the new instance starts.
- Waiting: a request with no idle instance waits for a busy one when that is cheaper than a
  new instance's start (the queue is simulated against the busy instances' expected rests).
- Pre-warm: when nothing is left, recent exact gaps predict the next arrival; an instance is
  started so as to be ready just before it when that beats the expected cost of a cold start
  (periodic functions, bursts that recur).
"""

import heapq
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from controller.core.policy.base import NO_PREWARM, KeepAlive, Policy, Prewarm, QueuePlan
from controller.core.policy.estimate import start_ms
from controller.core.state import GAP_BINS, PEAK_HALF_LIFE_MS, FnState, Instance, Phase

_UPPER = [2 ** ((i + 1) / 2) for i in range(GAP_BINS)]  # upper edge of each gap bin, ms
_MID = [2 ** ((i + 0.5) / 2) for i in range(GAP_BINS)]


@dataclass(frozen=True)
class Learned(Policy):
    name: str = "learned"
    wait_gb: float = 20.0  # slot GB·s one second of waiting is worth
    min_samples: int = 3

    # --- what the history says -------------------------------------------------------------

    def _gb(self, s: FnState) -> float:
        return (s.meta.memory_mb if s.meta else 1024) / 1024

    def _rate(self, s: FnState, now: int | None = None) -> float:
        """Recent arrivals per ms; with `now`, the gap still open counts too (a lull lowers it)."""
        gaps = s.stats.gaps
        if not gaps:
            return 0.0
        span = sum(gaps) + (max(0, now - s.stats.last_arrival_ms) if now is not None else 0)
        return len(gaps) / max(span, 1)

    def miss_cost(self, s: FnState, gb: float) -> float:
        """GB·ms lost when a request finds no instance: it and those arriving meanwhile wait a start."""
        start = start_ms(s)
        followers = self._rate(s) * start
        return self.wait_gb * start * (1 + followers / 2) + gb * start

    def pool_target(self, s: FnState, now: int) -> int:
        """Instances worth keeping for the recent load: memory x k against expected waiting (M/M/k)."""
        runs = s.stats.runs
        if not runs:
            return 1
        run = max(sum(runs) / len(runs), 1.0)
        st = s.stats
        peak = st.peak_load * 0.5 ** ((now - st.peak_at_ms) / PEAK_HALF_LIFE_MS)
        load = max(self._rate(s, now) * run, peak)  # provision for the recent peak: a start is slow
        rate = load / run
        gb = self._gb(s)
        k = max(1, math.ceil(load + 1e-9))
        erlang_b = 1.0
        for j in range(1, k + 1):
            erlang_b = load * erlang_b / (j + load * erlang_b)
        best = math.inf
        while True:  # the cost is convex in k: stop at its first rise
            if k > load:
                wait = k * erlang_b / (k - load * (1 - erlang_b)) * run / (k - load)  # Erlang C x run / (k - load)
                cost = gb * k + self.wait_gb * rate * wait
            else:
                cost = math.inf
            if cost >= best:
                return k - 1
            best = cost
            k += 1
            erlang_b = load * erlang_b / (k + load * erlang_b)

    def lull_deadline(self, s: FnState, now: int) -> tuple[int, str]:
        """Until when the function's last instance is worth keeping, counted from its last arrival."""
        gb = self._gb(s)
        miss = self.miss_cost(s, gb)
        last = s.stats.last_arrival_ms
        elapsed = now - last
        hist = s.stats.gap_hist
        if sum(hist) < self.min_samples:
            keep = miss / gb  # ski rental: idle as long as a miss would cost
            if elapsed >= keep:
                return now, "little history, and idle longer than a miss would cost"
            return last + int(keep), f"little history: break-even keep-alive {keep / 1000:.3g}s after the last arrival"
        bins = [(max(_MID[i], elapsed), w) for i, w in enumerate(hist) if w > 0 and _UPPER[i] > elapsed]
        if not bins:
            return now, "no gap this long seen before"
        total = sum(w for _, w in bins)
        best_cost, best_t = total * miss, elapsed  # keep nothing: the next arrival misses
        caught = caught_w = 0.0
        for value, w in bins:
            caught += w * gb * (value - elapsed)
            caught_w += w
            cost = caught + (total - caught_w) * (gb * (value - elapsed) + miss)
            if cost < best_cost:
                best_cost, best_t = cost, value
        if best_t <= elapsed:
            return now, "a longer wait for the next arrival costs more than a miss"
        hit = caught_share(bins, best_t, total)
        return last + int(best_t) + 1, f"keep {(best_t - elapsed) / 1000:.3g}s more: {hit:.0%} of gaps end by then"

    # --- the policy's choices -----------------------------------------------------------------

    def keep_alive(self, s: FnState, inst: Instance, now: int) -> KeepAlive:
        if not inst.request_id:  # fresh from a pre-warm: hold it through the predicted arrival
            hold = self._prewarm_plan(s, now - start_ms(s))
            if hold is not None and hold[1] > now:
                return KeepAlive(hold[1], "pre-warmed: held through the predicted arrival")
        return self.expire(s, inst, now) or KeepAlive(now, "no reason to keep it")

    def expire(self, s: FnState, inst: Instance, now: int) -> KeepAlive | None:
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        target = self.pool_target(s, now)
        if live > target:
            return None  # surplus: the pool is larger than the load needs
        until, why = self.lull_deadline(s, now)
        return KeepAlive(until, why) if until > now else None

    def plan_queue(self, s: FnState, uncovered: int, now: int) -> QueuePlan:
        runs = sorted(s.stats.runs)
        if len(runs) < self.min_samples or not s.stats.start_ms:
            return QueuePlan(starts=uncovered)
        start = start_ms(s)
        typical = runs[len(runs) // 2]
        gb = self._gb(s)
        free = []  # when each instance is expected to take the next waiting request
        for inst in s.instances.values():
            if inst.phase is Phase.BUSY:
                left = _remaining(runs, now - inst.since_ms)
                if left is not None:
                    free.append(now + left)
            elif inst.phase is Phase.CREATING:
                free.append(max(now, inst.wanted_ms + start))
        heapq.heapify(free)
        starts, first_wait = 0, None
        for _ in s.queue:
            fresh = now + start
            if free and self.wait_gb * (free[0] - fresh) <= gb * start:
                at = heapq.heappop(free)  # waiting costs less than a new slot's start
                if first_wait is None and at > now:
                    first_wait = at
                heapq.heappush(free, at + typical)
            else:
                starts += 1
                heapq.heappush(free, fresh + typical)
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        starts = min(max(starts, self.pool_target(s, now) - live), uncovered)
        if starts == uncovered or first_wait is None:
            return QueuePlan(starts=starts)
        return QueuePlan(
            starts=starts,
            why=f"wait ~{first_wait - now:.0f} ms for a busy instance rather than a {start} ms start",
            recheck_ms=int(first_wait + max(5, typical // 4)),
            expected_ms=int(first_wait),
        )

    def prewarm(self, s: FnState, now: int) -> Prewarm:
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        if live or s.queue:
            target = self.pool_target(s, now)
            if live < target and self.lull_deadline(s, now)[0] > now:  # still active
                return Prewarm(target - live, f"pool target {target} for the recent load")
            return NO_PREWARM
        plan = self._prewarm_plan(s, now)
        if plan is None:
            return NO_PREWARM
        begin, _ = plan
        if begin > now:
            return Prewarm(next_ms=begin)
        return Prewarm(1, f"pre-warm: next arrival expected {(begin + start_ms(s) - now) / 1000:.3g}s from now")

    def _prewarm_plan(self, s: FnState, now: int) -> tuple[int, int] | None:
        """(when to start an instance, until when to hold it), or None when a cold start is cheaper.

        Over recent exact gaps longer than the current one: an instance ready at R and held until
        R + H costs its start and its wait for an arrival; an arrival before R waits (or misses
        if the start has not begun), one after R + H misses.
        """
        last = s.stats.last_arrival_ms
        elapsed = now - last
        xs = sorted(g for g in s.stats.gaps if g > elapsed)
        if len(xs) < self.min_samples or not s.stats.start_ms:
            return None
        gb, start, lam = self._gb(s), start_ms(s), self.wait_gb
        miss = self.miss_cost(s, gb)
        prefix = [0]
        for x in xs:
            prefix.append(prefix[-1] + x)
        n = len(xs)

        def span(lo: float, hi: float, right: bool = False) -> tuple[int, float]:
            i, j = bisect_left(xs, lo), (bisect_right if right else bisect_left)(xs, hi)
            return j - i, prefix[j] - prefix[i]

        best, plan = n * miss, None
        for ready in sorted(set(xs)):
            if ready - start < elapsed:
                continue  # too late to be ready by then
            early, _ = span(-math.inf, ready - start)
            waits, waits_sum = span(ready - start, ready)
            base = early * miss + lam * (waits * ready - waits_sum) + waits * gb * start
            for hold_end in xs[bisect_left(xs, ready) :]:
                served, served_sum = span(ready, hold_end, right=True)
                late = n - early - waits - served
                cost = base + gb * (served * (start - ready) + served_sum)
                cost += late * (gb * (start + hold_end - ready) + miss)
                if cost < best:
                    best, plan = cost, (last + int(ready) - start, last + int(hold_end) + 1)
        return plan


def caught_share(bins: list[tuple[float, float]], until: float, total: float) -> float:
    return sum(w for value, w in bins if value <= until) / total if total else 0.0


def _remaining(runs: list[int], elapsed: int) -> float | None:
    """Expected rest of a run that has lasted `elapsed`: median of the longer recent runs, minus elapsed.

    A run longer than every recent one is in the tail: expect it to end within a quarter of a
    typical run, unless it has lasted twice the longest, when it is not to be waited for.
    """
    longer = runs[bisect_right(runs, elapsed) :]
    if longer:
        return longer[len(longer) // 2] - elapsed
    if elapsed > 2 * runs[-1]:
        return None
    return max(1.0, runs[len(runs) // 2] / 4)
