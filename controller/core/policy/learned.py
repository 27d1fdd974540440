"""Our policy: learn each function from its own events, and weigh waiting against memory.

The challenge's score trades slot memory x time (GB·s) against time requests wait. Every choice
here goes through one exchange rate, `wait_gb`: the slot GB·s one second of waiting is worth.
It is learned from the run itself (`exchange_rate`): the rate at which the score trades the two
at the best point this workload allows, so a trace of tiny executions (where memory is what a
scaler can save) and one of long executions (where waiting is) each get their own.

- Pool: while a function is active, keep the number of instances k that minimises memory x k
  + wait_gb x expected waiting (Erlang C on its recent arrival rate and run time), plus spares
  for instances lost with their request (need_destroy) during a start. A clearly larger pool
  shrinks as instances go idle.
- Lulls: how long after the last arrival to keep the last instance, from a time-decayed
  histogram of the function's gaps (rare long gaps stay remembered): keep while the expected
  memory until the next arrival costs less than a miss. A miss costs the start time for the
  first request and for those that arrive meanwhile (followers, at the rate within a burst).
  Memory enters both sides: a large function is kept for less time than a small one.
- Waiting: with no idle instance, start the number of instances that minimises the queue's
  expected total wait (the queue now and the arrivals to come, simulated against the busy
  instances' expected rests) x wait_gb plus their cost; the others wait for a busy one.
- Pre-warm: when nothing is left, the recent burst-to-burst periods predict the next burst; an
  instance is started to be ready just before it when that beats the expected cost of a cold
  start (periodic functions, bursts that recur).
"""

import heapq
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace

from controller.core.features import GAP_BINS, gap_bin
from controller.core.policy.base import NO_PREWARM, KeepAlive, Policy, Prewarm, QueuePlan
from controller.core.policy.estimate import start_ms
from controller.core.state import FnState, Instance, Phase, Totals

_UPPER = [2 ** ((i + 1) / 2) for i in range(GAP_BINS)]  # upper edge of each gap bin, ms
_MID = [2 ** ((i + 0.5) / 2) for i in range(GAP_BINS)]


@dataclass(frozen=True)
class Learned(Policy):
    name: str = "learned"
    wait_gb: float = 5.0  # slot GB·s one second of waiting is worth, until the run says better
    min_samples: int = 3

    def tuned_to(self, totals: Totals) -> "Learned":
        """Value waiting at the rate the score trades it for memory, given the run so far."""
        rate = exchange_rate(totals)
        if rate is None:
            return self
        return replace(self, wait_gb=min(max(rate, MIN_WAIT_GB), MAX_WAIT_GB))

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
        """GB·ms lost when a request finds no instance: it and those arriving meanwhile wait a start.

        Followers arrive at the rate within a burst (gaps shorter than two starts), at most as many
        as a burst holds.
        """
        start = start_ms(s)
        near = [g for g in s.stats.gaps if g <= 2 * start]
        far = len(s.stats.gaps) - len(near)
        followers = 0.0
        if near:
            per_burst = len(near) / max(far, 1)  # followers a burst brings after its first request
            followers = min(len(near) / max(sum(near), 1) * start, per_burst)
        return self.wait_gb * start * (1 + followers / 2) + gb * start

    def pool_target(self, s: FnState, now: int) -> int:
        """Instances worth keeping for the recent load: memory x k against expected waiting (M/M/k)."""
        runs = s.stats.runs
        if not runs:
            return 1
        run = max(sum(runs) / len(runs), 1.0)
        rate = self._rate(s, now)
        load = rate * run
        gb = self._gb(s)
        k = max(1, math.ceil(load + 1e-9))
        erlang_b = 1.0
        for j in range(1, k + 1):
            erlang_b = load * erlang_b / (j + load * erlang_b)
        best = math.inf
        spares = self._spares(s, rate, gb)
        variability = (_scv(s.stats.gaps) + _scv(runs)) / 2  # Allen-Cunneen: 1 for Poisson arrivals and runs
        while True:  # the cost is convex in k: stop at its first rise
            if k > load:
                erlang_c = k * erlang_b / (k - load * (1 - erlang_b))
                wait = variability * erlang_c * run / (k - load)
                cost = gb * k + self.wait_gb * rate * wait
            else:
                cost = math.inf
            if cost >= best:
                return k - 1 + spares
            best = cost
            k += 1
            erlang_b = load * erlang_b / (k + load * erlang_b)

    def _spares(self, s: FnState, rate: float, gb: float) -> int:
        """Instances kept beyond the load for those lost with their request (need_destroy).

        Deaths come at `rate` x the share of requests that kill their instance; one that finds no
        spare makes every arrival during a start wait. Keep the number of spares s that minimises
        memory x s + wait_gb x (deaths that find none) x (their wait), deaths being Poisson within a start.
        """
        st = s.stats
        if not st.deaths or not rate:
            return 0
        deaths = rate * st.deaths / st.arrivals  # per ms
        start = start_ms(s)
        expected = deaths * start  # deaths within one start
        cost_of_one = rate * start * start / 2  # ms of waiting when no spare covers it
        best_s, best, tail, term = 0, math.inf, 1.0, math.exp(-expected)
        for spare in range(8):
            tail -= term  # P(more than `spare` deaths within a start)
            cost = gb * spare + self.wait_gb * deaths * max(tail, 0.0) * cost_of_one
            if cost >= best:
                break
            best_s, best = spare, cost
            term *= expected / (spare + 1)
        return best_s

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
        bins = gap_points(hist, s.stats.gaps, elapsed)
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
        if live > target + max(1, target // 10):
            return None  # surplus: the pool is clearly larger than the load needs (slack: no churn)
        until, why = self.lull_deadline(s, now)
        return KeepAlive(until, why) if until > now else None

    def plan_queue(self, s: FnState, uncovered: int, now: int) -> QueuePlan:
        """Start the number of instances that minimises the queue's total wait x `wait_gb` plus their cost.

        The queue is simulated first-come first-served against the busy instances' expected rests
        and the instances being created, and against m new ones ready after a start; a new one
        costs its start and as much again of idle tail.
        """
        runs = sorted(s.stats.runs)
        if len(runs) < self.min_samples or not s.stats.start_ms:
            return QueuePlan(starts=uncovered)
        start = start_ms(s)
        typical = runs[len(runs) // 2]
        gb = self._gb(s)
        free = _when_free(s, runs, start, now)
        # Who will want an instance: the queue now, and arrivals over the next two starts at the
        # recent rate (a queue that cannot keep up with them keeps growing).
        arrivals = [float(now)] * len(s.queue[:QUEUE_SIMULATED])
        rate = self._rate(s)
        if rate:
            arrivals += [now + (j + 1) / rate for j in range(min(int(rate * 2 * start), QUEUE_SIMULATED))]

        def waits(extra: int) -> tuple[float, float | None]:
            """Total expected wait of those requests, and when the first one waiting now is served."""
            heap = free + [now + start] * extra
            heapq.heapify(heap)
            total, first = 0.0, None
            for arrived in arrivals:
                at = max(heapq.heappop(heap) if heap else math.inf, arrived)
                total += at - arrived
                first = at if first is None else first
                heapq.heappush(heap, at + typical)
            return total, first

        best_m, (wait, first) = 0, waits(0)
        best = self.wait_gb * wait
        for m in range(1, min(uncovered, MAX_STARTS) + 1):
            total, at = waits(m)
            cost = self.wait_gb * total + m * 2 * gb * start
            if cost >= best:
                break
            best_m, best, first = m, cost, at
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        starts = min(max(best_m, self.pool_target(s, now) - live), uncovered)
        if starts == uncovered or first is None or first == math.inf:
            return QueuePlan(starts=starts)
        return QueuePlan(
            starts=starts,
            why=f"wait ~{first - now:.0f} ms for a busy instance rather than a {start} ms start",
            recheck_ms=int(first + max(5, typical // 4)),
            expected_ms=int(first),
        )

    def prewarm(self, s: FnState, now: int) -> Prewarm:
        if s.queue or any(i.phase is not Phase.RETIRING for i in s.instances.values()):
            return NO_PREWARM  # a function with instances grows only for waiting requests (`plan_queue`)
        plan = self._prewarm_plan(s, now)
        if plan is None:
            return NO_PREWARM
        begin, _ = plan
        if begin > now:
            return Prewarm(next_ms=begin)
        return Prewarm(1, f"pre-warm: next arrival expected {(begin + start_ms(s) - now) / 1000:.3g}s from now")

    def _prewarm_plan(self, s: FnState, now: int) -> tuple[int, int] | None:
        """(when to start an instance, until when to hold it) for the next burst, or None when a
        cold start is cheaper. From recent burst-to-burst periods longer than the time since this
        burst began."""
        st = s.stats
        since = now - st.burst_start_ms
        xs = sorted(p for p in st.bursts if p > since)
        if len(xs) < self.min_samples or not st.start_ms:
            return None
        gb = self._gb(s)
        burst_gap = 2 * start_ms(s)
        near = [g for g in st.gaps if g <= burst_gap]
        rate = len(near) / max(sum(near), 1) if near else 0.0  # arrivals per ms within a burst
        plan = best_prewarm(xs, since, start_ms(s), gb, self.wait_gb, self.miss_cost(s, gb), rate)
        if plan is None:
            return None
        ready, hold_end, _ = plan
        return st.burst_start_ms + int(ready) - start_ms(s), st.burst_start_ms + int(hold_end) + 1


def best_prewarm(
    xs: list[int],
    elapsed: float,
    start: int,
    gb: float,
    lam: float,
    miss: float,
    rate: float = 0.0,
    candidates: int = 16,
) -> tuple[float, float, float] | None:
    """The instance to have ready at R and hold until H (times after the last arrival) for arrivals at
    the sorted gaps `xs` (all > `elapsed`, when nothing is kept), and its expected total cost; None
    when letting every arrival miss is cheaper. An arrival before R - start misses; one before R
    waits for the starting instance, and so do those arriving at `rate` (per ms) meanwhile; one
    after H misses. Costs in GB·ms (`lam` per ms of waiting).
    """
    n = len(xs)
    prefix, squares = [0.0], [0.0]
    for x in xs:
        prefix.append(prefix[-1] + x)
        squares.append(squares[-1] + x * x)

    def span(lo: float, hi: float, right: bool = False) -> tuple[int, int]:
        return bisect_left(xs, lo), (bisect_right if right else bisect_left)(xs, hi)

    step = max(1, n // candidates)
    readies = sorted({x for x in xs[::step] if x - start >= elapsed})
    best, plan = n * miss, None
    for ready in readies:
        i0, i1 = span(-math.inf, ready - start)
        early = i1 - i0
        j0, j1 = span(ready - start, ready)
        waits = j1 - j0
        # sum over waiting arrivals of w (1 + rate w / 2), with w = ready - g
        w1 = waits * ready - (prefix[j1] - prefix[j0])
        w2 = waits * ready * ready - 2 * ready * (prefix[j1] - prefix[j0]) + (squares[j1] - squares[j0])
        base = early * miss + lam * (w1 + rate * w2 / 2) + waits * gb * start
        for hold_end in xs[bisect_left(xs, ready) :: step]:
            k0, k1 = span(ready, hold_end, right=True)
            served, served_sum = k1 - k0, prefix[k1] - prefix[k0]
            late = n - early - waits - served
            cost = base + gb * (served * (start - ready) + served_sum) + late * (gb * (start + hold_end - ready) + miss)
            if cost < best:
                best, plan = cost, (ready, hold_end, cost)
    return plan


QUEUE_SIMULATED = 64  # waiting and coming requests the queue plan simulates (a longer queue behaves alike)
MAX_STARTS = 32  # instances started in one decision at most
MIN_EXEC_MS = 30_000  # execution the run needs before its exchange rate is trusted
MIN_WAIT_GB, MAX_WAIT_GB = 0.1, 1000.0


def exchange_rate(t: Totals) -> float | None:
    """GB·s of slot time that one second of waiting costs the score, at the run's best reachable point.

    score = 50 E_gb / S + 50 E / (E + W): d/dW = -50 E / (E + W)^2, d/dS = -50 E_gb / S^2, so a
    second of waiting is worth (E / (E + W)^2) / (E_gb / S^2) GB·s. Taken at our own S and W, this
    feeds on itself (keep more, memory looks cheaper, keep more); so it is taken where a
    clairvoyant scaler would be on this workload: W = 0 and S = E_gb + the idle it could not avoid.
    """
    if t.exec_ms < MIN_EXEC_MS or t.exec_gb_ms <= 0:
        return None
    e, e_gb = t.exec_ms / 1000, t.exec_gb_ms / 1000
    slot = e_gb + t.ideal_gb_ms / 1000
    return slot * slot / (e * e_gb)


def gap_points(hist: tuple[float, ...], recent: tuple[int, ...], elapsed: float) -> list[tuple[float, float]]:
    """The gaps still possible after `elapsed`, as (ms, weight) in order: each bin's weight where its recent gaps
    were (a timer's period is where it is, not at its bin's middle), or at the bin's middle when none is recent."""
    exact: dict[int, list[int]] = {}
    for g in recent:
        if g > elapsed:
            exact.setdefault(gap_bin(g), []).append(g)
    points = []
    for i, w in enumerate(hist):
        if w <= 0 or _UPPER[i] <= elapsed:
            continue
        here = exact.get(i)
        if here:
            points += [(float(g), w / len(here)) for g in sorted(here)]
        else:
            points.append((max(_MID[i], elapsed), w))
    return points


def _scv(values: tuple[int, ...]) -> float:
    """Squared coefficient of variation: 0 for a clock, 1 for exponential gaps, more for bursts."""
    if len(values) < 2:
        return 1.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 1.0
    return sum((v - mean) ** 2 for v in values) / len(values) / (mean * mean)


def caught_share(bins: list[tuple[float, float]], until: float, total: float) -> float:
    return sum(w for value, w in bins if value <= until) / total if total else 0.0


def _when_free(s: FnState, runs: list[int], start: int, now: int) -> list[float]:
    """When each instance is expected to take its next waiting request: busy ones after their expected
    rest, those being created when ready; a busy one not worth waiting for is left out."""
    free = []
    for inst in s.instances.values():
        if inst.phase is Phase.BUSY:
            left = _remaining(runs, now - inst.since_ms)
            if left is not None:
                free.append(now + left)
        elif inst.phase is Phase.CREATING:
            free.append(max(now, inst.wanted_ms + start))
    return free


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
