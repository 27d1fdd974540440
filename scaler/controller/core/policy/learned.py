"""Our policy: learn each function from its own events, and weigh waiting against memory.

The challenge's score trades slot memory x time (GB·s) against time requests wait. Every choice
here goes through one exchange rate (`Learned.wait_gb`): the slot GB·s one second of waiting is worth.
It is learned from the run itself (`RunView.exchange_rate`, `base.score_rate`): the rate at which the
score trades the two where a clairvoyant scaler would stand on this workload, whose slot time the
features fold from the arrivals, concurrency included (`features._clairvoyant`); a config may fix it
instead (`LearnedConfig.exchange_rate`). Every knob is a field of `LearnedConfig`.

What a function's history says (`next_arrival`, `outlook`; the arithmetic is in forecast.py):
- The next arrival: the time-decayed histogram of its gaps, each bin's weight put where the recent
  gaps in it were, exactly (a timer's period where it is, not at its bin's middle), those of a lull's
  bins spread as much as such gaps vary. Each bin's points are built as the gaps come, when a decision asks
  (scaler/controller/core/next_gap.py); the decision puts the bins' weights on them.
  Past its longest gap, a Pareto tail: the longer a lull has lasted, the longer it may. A function with
  little history of its own borrows how soon the run's new functions came back, rather than keeping an
  instance for the break-even time of a miss; a gap still open counts as one that lasted at least its
  age (Kaplan-Meier), so functions with long periods, not back yet, do not read as never coming back.
  A clock called besides its ticks keeps its beat: its next tick is counted from the last one, not from
  the call (`forecast.beat`); after a tick that came late or early, half its weight is where it would be
  had the tick come on the beat (`forecast.either_beat`). A function called in groups with alike pauses
  between them has its next gap read from its place in the current group (`forecast.group_pause`): after a
  group's last call a pause comes, and its instance is retired to start again just before the pause ends,
  rather than kept through every pause as its gaps read as a whole would say. Gaps that vary as an exponential's
  (Poisson calls) say how many shorter than the shortest seen to expect, and where; other gaps, that
  the next may be shorter than any seen one time in n + 1, as far below as they vary.
- A burst (its gaps shorter than two starts): the rate within it, the instances it needs (the pool
  below, at that rate), and what missing it costs: its first request waits a start, its followers
  half a start each and then in the queue they made, which those instances drain a run at a time.

- The system it runs on (`Delays`): its recent starts as the core saw them (the platform's CreateSlot and
  Init, and the node's dispatch and report of them), how late its keep-alive timers were acted on, and how
  much longer than their runs its requests held their instances (the node's own time in a call), all folded
  from its events: measured live on the node, and offline on a latency model played by the simulator
  (scaler/simulator/latency.py), none without one. A pre-warm is started as far ahead as the starts and
  timers measured say (past the longest seen by as much as waiting is dearer than memory), and a restart
  is priced at what it costs besides memory: the risk of its instance being late, and the node's own work.

What it decides:
- Pool: while a function is busy it keeps the k instances that minimise memory x k + wait_gb x expected
  waiting: Erlang C on the recent rate and busy time, scaled by (ca^2 + cs^2) / 2 (Allen-Cunneen), so a
  timer's arrivals queue far less than Poisson ones and a burst's more; for calls that come in bunches (a
  call and those within a quarter of a run after it: `forecast.bunches`), at least what they wait within
  their bunch, k at a time, which Erlang C, seeing them come one at a time at their rate, leaves out. A
  request that kills its instance (need_destroy) keeps it busy a start longer, plus spares. A pool
  shrinks only past the load half a standard error above its estimate, so that it does not shrink and
  grow with the noise of its rate; it grows only for waiting requests (pre-warms to a target while active
  churn, and overshoot at a burst's end).
- Lulls (`lull`): for the next arrival, the cheapest of keeping one instance, or as many as a burst
  needs, until some time; retiring them (a miss); and, when nothing is busy, retiring them to start again
  just before the next arrival (`return_plan`), when the history says when, and its lulls do not vary as
  an exponential's: Poisson calls end a lull as likely now as later, and a few lulls' holes (where none
  came yet, by chance) are no reason to be away from one. A keep that reaches past a
  burst is looked at again at its end, when it may be cheaper to come back later. Fewer instances kept
  than a burst needs cost what its followers then wait: they queue for the kept ones a run at a time
  (Erlang C at the rate within bursts, or within their bunch), not a start each. The plans look for the
  cheapest place to hold until over the points' prefix sums (`forecast.Points`), a few lookups each.
- Waiting (`plan_queue`): with no idle instance, start the number of instances that minimises the
  queue's expected total wait (the queue now and the arrivals to come, simulated against the busy
  instances' expected rests) x wait_gb plus their cost; the others wait for a busy one.
- Pre-warm (`prewarm`): with nothing live, the return plan: one instance or a burst's worth, ready
  just before the predicted arrival and held through its spread. Only an instance started for a
  predicted arrival, that no arrival has come for since, is held so; any other (a cold start whose
  request another instance served) is kept or retired like the rest. A leader that came back, when
  the function's call follows it sooner than a start, has the instances its burst needs started at
  once (`_imminent`): none is ready for the call, but each waits less by the lag.
"""

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import repeat
from typing import Annotated

import msgspec

from scaler.controller.core import next_gap
from scaler.controller.core.features import FOLLOW_MS, FnStats, Leader, gap_bin
from scaler.controller.core.next_gap import KERNEL, NextGap
from scaler.controller.core.policy import forecast
from scaler.controller.core.policy.base import (
    NO_PREWARM,
    UNSEEN,
    Capability,
    KeepAlive,
    Policy,
    PolicyConfig,
    Prewarm,
    QueuePlan,
    RunView,
)
from scaler.controller.core.policy.estimate import start_ms
from scaler.controller.core.policy.forecast import (
    NO_BUNCHES,
    Bunches,
    Option,
    Plan,
    Point,
    Points,
    beat,
    beyond,
    blend,
    bunches,
    either_beat,
    group_pause,
    in_group,
    keep_plan,
    lag_points,
    memoryless_below,
    new_function_points,
    own_points,
    pool_size,
    queue_wait,
    restart_plan,
    scv,
    served_within,
    share_by,
)
from scaler.controller.core.state import FnState, Instance, Phase


class LearnedConfig(PolicyConfig, frozen=True, kw_only=True):
    wait_gb: Annotated[
        float, msgspec.Meta(description="slot GB·s one second of waiting is worth, until the run says better")
    ] = 5.0
    exchange_rate: Annotated[
        float | None,
        msgspec.Meta(description="slot GB·s one second of waiting is worth, fixed; None: learned from the run"),
    ] = None
    min_wait_gb: Annotated[float, msgspec.Meta(description="the least exchange rate learned from a run, GB·s")] = 0.1
    max_wait_gb: Annotated[float, msgspec.Meta(description="the most exchange rate learned from a run, GB·s")] = 1000.0
    min_samples: Annotated[
        int, msgspec.Meta(description="gaps of its own a function needs before its own history says when it comes")
    ] = 3
    memoryless_from: Annotated[
        int, msgspec.Meta(description="gaps a function needs before they are taken for an exponential's")
    ] = 5
    memoryless_scv_min: Annotated[
        float, msgspec.Meta(description="the least squared coefficient of variation taken for an exponential's")
    ] = 0.5
    memoryless_scv_max: Annotated[
        float, msgspec.Meta(description="the most squared coefficient of variation taken for an exponential's")
    ] = 2.0
    early_weight: Annotated[
        float, msgspec.Meta(description="weight, in gaps, of a next gap shorter than any seen (1 in n + 1)")
    ] = 1.0
    queue_simulated: Annotated[
        int, msgspec.Meta(description="waiting and coming requests the queue plan simulates")
    ] = 64
    max_starts: Annotated[int, msgspec.Meta(description="instances started in one decision at most")] = 32
    prior_weight: Annotated[
        float, msgspec.Meta(description="what the run's new functions weigh against a function's own gaps, in gaps")
    ] = forecast.PRIOR_WEIGHT
    min_new_functions: Annotated[
        int, msgspec.Meta(description="gaps of new functions the run needs before they say anything")
    ] = forecast.MIN_NEW_FUNCTIONS
    clock_share: Annotated[
        float, msgspec.Meta(description="the share of recent gaps on the beat that makes a function a clock's")
    ] = forecast.CLOCK_SHARE
    beat_sds: Annotated[
        float, msgspec.Meta(description="how far from the period a gap is still on the beat, in robust sds")
    ] = forecast.BEAT_SDS
    beat_share: Annotated[float, msgspec.Meta(description="... or in shares of the period, whichever is wider")] = (
        forecast.BEAT_SHARE
    )
    groups_from: Annotated[
        int, msgspec.Meta(description="groups of calls of the current one's size needed to read its rhythm")
    ] = forecast.GROUPS_FROM
    group_pauses_alike: Annotated[
        float,
        msgspec.Meta(description="the pauses after those groups are alike: the longest at most this x the shortest"),
    ] = forecast.GROUP_PAUSES_ALIKE
    lead_share: Annotated[
        float,
        msgspec.Meta(description="how reliably a leader's return must have brought the function's call to pre-warm"),
    ] = 0.9
    bunch_share: Annotated[
        float,
        msgspec.Meta(description="a call and those within this share of a run after it come at once: a bunch"),
    ] = 0.25
    between_share: Annotated[
        float,
        msgspec.Meta(
            description="the share of a function's gap weight spread over the half-octaves between its bursts and its"
            " longest gap where none came yet, each alike: a next gap possible where the recent ones say never"
        ),
    ] = 0.0
    restart_decisions: Annotated[
        float,
        msgspec.Meta(
            description="the node's decisions a restart adds (its start, the slot's reports, its destruction), each"
            " priced as half a call's measured overhead of waiting"
        ),
    ] = 4.0


@dataclass(frozen=True)
class NextArrival:
    """When the function's next call may come (ms after its last), and whether its own gaps say when."""

    points: Points
    timed: bool


@dataclass(frozen=True)
class LeaderCue:
    """Where a leader's return puts the function's next call, how likely it comes then, and which leader says so
    (empty: none does)."""

    points: list[Point]
    share: float
    leader: str


NO_CUE = LeaderCue([], 0.0, "")


@dataclass(frozen=True)
class Following:
    """The leader whose return says when the function is called next, and when it came back."""

    leader: Leader | None
    at_ms: int


@dataclass(frozen=True)
class Lull:
    """How many instances to keep for the function's next arrival, until when (ms), and why."""

    until_ms: int
    count: int
    why: str


@dataclass(frozen=True)
class Burst:
    """Arrivals per ms within a burst, and how many more a burst brings once it has begun, on average."""

    rate: float
    coming: float


@dataclass(frozen=True)
class Outlook:
    """What a function's history says about its next burst, worked out once per choice."""

    gb: float
    start: int  # ms from wanting an instance to its being ready
    burst_rate: float  # arrivals per ms within bursts (gaps shorter than two starts)
    need: int  # instances a burst needs to be served without waiting
    followers_wait: float  # ms a burst's followers wait in all when it finds no instance
    miss: float  # GB·ms a burst that finds no instance costs: its first request's wait and start, its followers'
    lam: float  # GB·ms one ms of waiting is worth
    followers: float = 0.0  # arrivals a burst brings within a start of its first
    run: float = 0.0  # ms a request keeps its instance, on average
    variability: float = 1.0  # (ca^2 + cs^2) / 2 of the arrivals within bursts and of the runs
    bunched: Bunches = NO_BUNCHES  # recent calls in bunches: how many of each size
    lead: int = 0  # ms from starting an instance for a predicted arrival to its being surely ready (`Delays`)
    restart: float = 0.0  # GB·ms a start costs besides its memory: its risk of being late, the node's work

    def shortfall(self, count: int) -> float:
        """What an arrival served by `count` ready instances still costs: its followers that find none free."""
        return 0.0 if count >= self.need else self.lam * self.followers_wait * (1 - count / self.need)

    def kept_shortfall(self, count: int) -> float:
        """What an arrival served by `count` instances kept through a lull still costs: its followers queue
        for them a run at a time (Erlang C at the rate within bursts), not a start, so it may cost far less
        than `shortfall`, and never more. A return plan still counts `shortfall`: counted so there, one
        pre-warmed instance would be held in a burst's stead for bursts that may not come."""
        if count >= self.need:
            return 0.0
        queued = self.followers * queue_wait(self.burst_rate, self.run, count, self.variability, self.bunched)
        return min(self.shortfall(count), self.lam * queued)

    def options(self, kept: bool = False) -> list[Option]:
        """What to have ready for the next arrival: one instance, or as many as a burst needs (`kept`: of
        those live now)."""
        cost = self.kept_shortfall if kept else self.shortfall
        return [Option(k, self.gb * k, cost(k)) for k in sorted({1, self.need})]


class Learned(Policy):
    name = "learned"
    Config = LearnedConfig
    capabilities = Capability.FOLLOWS_LEADERS  # a function another one calls is pre-warmed when that one comes back
    config: LearnedConfig

    def wait_gb(self, run: RunView) -> float:
        """Slot GB·s one second of waiting is worth at this decision: the config's fixed rate, else the rate the
        score trades waiting for memory given the run so far (`RunView.exchange_rate`), else `wait_gb`."""
        c = self.config
        if c.exchange_rate is not None:
            return c.exchange_rate
        rate = run.exchange_rate
        return c.wait_gb if rate is None else min(max(rate, c.min_wait_gb), c.max_wait_gb)

    # --- what the history says -------------------------------------------------------------

    def outlook(self, s: FnState, f: FnStats, run: RunView = UNSEEN) -> Outlook:
        """The function's next burst: how fast it comes, how many instances it needs, what missing it costs.

        A burst's followers (arrivals during one start after its first, at the rate within bursts, at
        most a burst's size) wait half a start each when it finds no instance, then in the queue they
        made, which the instances it needs drain a run at a time.
        """
        gb, start, runs, gaps, lam = _gb(s, f), start_ms(s, f), f.runs, f.gaps, self.wait_gb(run)
        near = [g for g in gaps if g <= 2 * start]
        busy = _busy(s, f) if runs else 0.0
        rate = len(near) / max(sum(near), 1) if near else 0.0
        need, variability = 1, (scv(near) + scv(runs)) / 2
        bunched = self._bunched(f, busy)
        if runs and len(near) >= 2:
            need = pool_size(rate, busy, gb, lam, variability, bunched)
        followers = min(rate * start, len(near) / max(len(gaps) - len(near), 1)) if near else 0.0
        waits = followers * start / 2 + followers * followers * busy / (2 * need)
        delays = Delays.of(f, start, gb, lam, self.config.restart_decisions)
        miss = lam * (start + waits) + gb * start + delays.work
        restart = delays.work + lam * delays.late
        return Outlook(
            gb, start, rate, need, waits, miss, lam, followers, busy, variability, bunched, delays.lead, restart
        )

    def pool_target(self, s: FnState, f: FnStats, now: int, margin: float = 0.0, run: RunView = UNSEEN) -> int:
        """Instances worth keeping for the recent load (`forecast.pool_size`), plus spares for those that die.

        `margin`: for the rate `margin` standard errors above its estimate (the recent gaps are a sample).
        """
        runs, gaps, lam = f.runs, f.gaps, self.wait_gb(run)
        if not runs:
            return 1
        busy = _busy(s, f)
        rate, gb = _rate(s, f, now), _gb(s, f)
        arrivals = scv(gaps)
        if margin and gaps:
            rate *= 1 + margin * math.sqrt(arrivals / len(gaps))
        variability = (arrivals + scv(runs)) / 2
        pool = pool_size(rate, busy, gb, lam, variability, self._bunched(f, busy))
        return pool + _spares(s, f, rate, gb, lam)

    def _bunched(self, f: FnStats, busy: float) -> Bunches:
        """The recent calls in bunches (`forecast.bunches`): those closer than a share of a run come at once."""
        return bunches(f.gaps, self.config.bunch_share * busy) if busy else NO_BUNCHES

    def _little_history(self, s: FnState, f: FnStats, run: RunView) -> bool:
        """Too few gaps of its own, and too few of the run's new functions to go by."""
        return (
            sum(f.gap_hist) < self.config.min_samples
            and sum(run.new_gaps) + len(run.new_open) < self.config.min_new_functions
        )

    def next_arrival(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> NextArrival:
        """When the function's next call may come (ms after its last), given none came by `now`: its own
        gaps, and how soon the run's new functions came back, weighing as much as one gap of its own; and
        whether its own gaps say when. Past its longest gap they do not (`forecast.beyond`). The next gap
        may be shorter than any seen, one time in n + 1: one gap's weight goes below the shortest, as far
        as the recent gaps vary (`_shorter_than_seen`); for a Poisson function, as many as the exponential
        its gaps fit puts there, where it puts them (`forecast.memoryless_below`). A leader that came back
        just now says when as well (`_cue`), with the weight its lead has earned."""
        own = self._own_forecast(s, f, now, run)
        cue = self._cue(s, f, now)
        if not cue.points:
            return own
        points, share, total = own.points, cue.share, own.points.total
        mine = [(x, w * (1 - share) / total) for x, w in points.pairs()] if total else []
        return NextArrival(Points.of(sorted(mine + cue.points)), True)

    def _own_forecast(self, s: FnState, f: FnStats, now: int, run: RunView) -> NextArrival:
        """The function's own gaps, counted from its last arrival (their points as `next_gap` builds them, with
        `between_share` of their weight where none came yet: `_between`); a clock's from its last tick
        (`forecast.beat`), and after a tick off its beat half as if it had come on it (`either_beat`); a
        function called in groups, as its current group's place says (`group_pause`)."""
        gaps = f.gaps
        c = self.config
        clock = beat(gaps, c.clock_share, c.beat_sds, c.beat_share)
        elapsed = now - f.last_arrival_ms + clock.since
        burst = 2 * start_ms(s, f)  # a longer gap is a lull (or a group's pause)
        seen = sum(f.gap_hist)
        shorter = []
        if gaps and min(gaps) <= elapsed:
            pass  # gaps shorter than any seen end before the shortest (by a margin): none is still possible
        elif _memoryless(gaps, c):
            shorter = memoryless_below(min(gaps), sum(gaps) / len(gaps), seen, elapsed)
        elif (early := _shorter_than_seen(gaps)) > elapsed:
            shorter = [(early, c.early_weight)]
        own = own_points(_between(_next_gap(s, f, burst), burst, seen * c.between_share), elapsed, shorter)
        if seen >= c.min_samples:
            points = own if own is not None else Points.of(beyond(max(elapsed, 1)))
        else:
            ages = run.new_open.ages(now)
            prior = new_function_points(run.new_gaps, ages, elapsed, c.prior_weight, c.min_new_functions)
            points = Points.of(blend(own.pairs() if own is not None else [], prior))
        if (
            not clock.since
            and own is not None
            and (group := group_pause(gaps, burst, c.groups_from, c.group_pauses_alike))
        ):
            points = in_group(points, group.ended, group.pauses, elapsed, burst)
        if clock.late:
            points = either_beat(points, clock.late, elapsed)
        return NextArrival(points._replace(shift=points.shift + clock.since), own is not None)

    def _cue(self, s: FnState, f: FnStats, now: int) -> LeaderCue:
        """Where a leader's return puts the function's next call (ms after its last), how likely it comes
        then, and which leader says so (`_lead`), when it comes mostly a start or more after the leader's
        return: one sooner cannot be served warm, and pre-warming for it would hold an instance for a few ms
        saved (`_imminent` starts its burst's instances instead)."""
        lead, at = (following := self._lead(s, f, now)).leader, following.at_ms
        if lead is None or _median_lag(lead) < start_ms(s, f):
            return NO_CUE
        last = f.last_arrival_ms
        points = lag_points(lead.lags, at - last, now - last, lead.share())
        return LeaderCue(points, lead.share(), lead.key) if points else NO_CUE

    def _lead(self, s: FnState, f: FnStats, now: int) -> Following:
        """The leader whose return says when the function is called next, and when it came back: one it
        follows came back under FOLLOW_MS ago while it had no instance (`Cued`), and the function came
        within FOLLOW_MS of nearly every such return before (`lead_share`). Of several, the most reliable."""
        leaders, best = {x.key: x for x in f.leaders}, Following(None, 0)
        for key, at in f.cues:
            lead = leaders.get(key)
            if lead is None or not lead.lags or now - at > FOLLOW_MS or lead.share() < self.config.lead_share:
                continue
            if best.leader is None or lead.share() > best.leader.share():
                best = Following(lead, at)
        return best

    def _imminent(self, s: FnState, f: FnStats, now: int, run: RunView) -> Prewarm:
        """A leader came back and the function's call comes sooner than a start after it: no instance is
        ready for it, but those its burst needs can be started now rather than at the call, so each of the
        burst's requests waits that much less: as many as `plan_queue` would start for the call."""
        lead, at = (following := self._lead(s, f, now)).leader, following.at_ms
        if lead is None or (lag := _median_lag(lead)) >= start_ms(s, f) or now - at >= lag:
            return NO_PREWARM
        plan = self._queue_plan(s, f, 1, 1, now, run)
        count = plan.starts + plan.ahead
        why = f"pre-warm: next arrival expected in {at + lag - now} ms, sooner than a start"
        return Prewarm(count, f"{why} ({lead.key} came back, and this function follows it)") if count else NO_PREWARM

    def return_plan(
        self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN, known: tuple[NextArrival, Outlook] | None = None
    ) -> Plan | None:
        """With nothing live: the instances to start for the next arrival (ready at `plan.ready`, held until
        `plan.until`, after the last arrival) and how many (`plan.count`), one or as many as a burst needs;
        None when a miss costs less, or when the function's history does not say when its next call comes.
        `known`: the next arrival and the outlook at `now`, when worked out already."""
        st = f
        if not st.start_ms or not st.arrivals or self._little_history(s, f, run):
            return None
        nxt, o = known or (self.next_arrival(s, f, now, run), self.outlook(s, f, run))
        if not nxt.timed:
            return None
        elapsed = now - st.last_arrival_ms
        return restart_plan(nxt.points, elapsed, o.lead, o.lam, o.miss, o.burst_rate, o.options(), restart=o.restart)

    def lull(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Lull:
        """How many instances to keep for the function's next arrival, until when, and why: the cheapest of
        keeping one or as many as a burst needs, retiring them (a miss), and, when the function is quiet,
        retiring them to start again just before the next arrival (`return_plan`)."""
        o, st = self.outlook(s, f, run), f
        last = st.last_arrival_ms
        elapsed = now - last
        if self._little_history(s, f, run):
            keep = (o.miss - o.kept_shortfall(1)) / o.gb  # nothing to go by: ski rental, idle as long as a miss costs
            if elapsed >= keep:
                return Lull(now, 0, "little history, and idle longer than a miss would cost")
            return Lull(
                last + int(keep),
                1,
                f"little history: break-even keep-alive {keep / 1000:.3g}s after the last arrival",
            )
        nxt = self.next_arrival(s, f, now, run)
        points = nxt.points
        keep = keep_plan(points, elapsed, o.miss, o.options(kept=True))
        count = keep.count
        quiet = not s.queue and all(i.phase in (Phase.IDLE, Phase.RETIRING) for i in s.instances.values())
        # A restart costs at least what the arrivals within a start from now wait for it (or miss). Lulls that
        # end at random (an exponential's) bring a call as likely while a return plan is away as while it holds,
        # so keeping or missing is cheaper; only the holes a few gaps leave by chance make it look otherwise
        # (gen-poisson/2's poisson-3, gaps of 5.8 s and 18.5 s: retired at 7.5 s, its next call at 11.4 s).
        if (
            quiet
            and not _memoryless(st.lulls, self.config)
            and served_within(points, o.lead, o.miss, o.lam, elapsed) < keep.cost
        ):
            back = self.return_plan(s, f, now, run, (nxt, o))
            if back is not None and back.cost < keep.cost and back.ready - o.lead > elapsed:
                return Lull(now, 0, "cheaper to start again just before the next arrival")
        if keep.until <= elapsed:
            return Lull(now, 0, "a longer wait for the next arrival costs more than a miss")
        burst_end = 2 * o.start  # a gap longer than this ends the burst: then look again (return, or keep)
        if elapsed < burst_end < keep.until:
            return Lull(last + burst_end + 1, count, "keep through the burst, then look again")
        more, hit = (keep.until - elapsed) / 1000, share_by(points, keep.until)
        return Lull(last + int(keep.until) + 1, count, f"keep {more:.3g}s more: {hit:.0%} of gaps end by then")

    # --- the policy's choices -----------------------------------------------------------------

    def keep_alive(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive:
        ahead = not inst.for_request and not inst.request_id  # started for a predicted arrival...
        if ahead and f.last_arrival_ms < inst.wanted_ms:  # ...still to come: hold it through it
            back = self.return_plan(s, f, inst.wanted_ms, run)
            until = f.last_arrival_ms + int(back.until) + 1 if back is not None else 0
            if until > now:
                return KeepAlive(until, "pre-warmed: held through the predicted arrival")
        return self._keep(s, f, now, run)

    def expire(self, s: FnState, f: FnStats, inst: Instance, now: int, run: RunView = UNSEEN) -> KeepAlive | None:
        keep = self._keep(s, f, now, run)
        return keep if keep.until_ms > now else None

    def _keep(self, s: FnState, f: FnStats, now: int, run: RunView) -> KeepAlive:
        """Keep the instance for the lull's plan, unless the function has more than that plan and the load need:
        clearly more, the load taken a standard error above its estimate, so that a pool does not shrink and
        grow again with the noise of its rate. Until now (retire it) says why not. Only ready instances count: one
        still starting may never be ready (the platform failing starts), and a ready one retired on its account would
        leave the function's next call a start that fails or waits, where the ready one would have served it."""
        live = sum(1 for i in s.instances.values() if i.phase in (Phase.IDLE, Phase.BUSY))
        until, count, why = (lull := self.lull(s, f, now, run)).until_ms, lull.count, lull.why
        if live > count and live > self.pool_target(s, f, now, margin=0.5, run=run):
            return KeepAlive(now, f"{live} live, more than the lull's {count} and the load's")
        return KeepAlive(until, why) if until > now else KeepAlive(now, why)

    def plan_queue(self, s: FnState, f: FnStats, uncovered: int, now: int, run: RunView = UNSEEN) -> QueuePlan:
        """Start the number of instances that minimises the queue's total wait x `wait_gb` plus their cost.

        The queue is simulated first-come first-served against the busy instances' expected rests
        and the instances being created, and against m new ones ready after a start; a new one
        costs its start and as much again of idle tail.
        """
        return self._queue_plan(s, f, len(s.queue), uncovered, now, run)

    def _queue_plan(self, s: FnState, f: FnStats, queued: int, uncovered: int, now: int, run: RunView) -> QueuePlan:
        """`plan_queue`, for `queued` requests waiting now (a call about to come counts as one)."""
        c, lam = self.config, self.wait_gb(run)
        runs = sorted(f.runs)
        if len(runs) < c.min_samples or not f.start_ms:
            return QueuePlan(starts=uncovered)
        start = start_ms(s, f)
        typical = runs[len(runs) // 2]
        busy = typical + _death_share(s, f) * start  # an instance that dies with its request is gone a start
        gb = _gb(s, f)
        free = _when_free(s, f, runs, start, now)
        # Who will want an instance: the queue now, and arrivals over the next two starts (a queue that
        # cannot keep up with them keeps growing): at the rate within bursts, as many as a burst brings.
        arrivals = [float(now)] * min(queued, c.queue_simulated)
        rate, coming = (burst := _burst(s, f, start)).rate, burst.coming
        if rate:
            arrivals += [
                now + (j + 1) / rate for j in range(min(int(rate * 2 * start), math.ceil(coming), c.queue_simulated))
            ]

        def waits(extra: int) -> tuple[float, float | None]:
            """Total expected wait of those requests, and when the first one waiting now is served."""
            heap = free + [now + start] * extra
            heapq.heapify(heap)
            total, first = 0.0, None
            for arrived in arrivals:
                at = max(heapq.heappop(heap) if heap else math.inf, arrived)
                total += at - arrived
                first = at if first is None else first
                heapq.heappush(heap, at + busy)
            return total, first

        # A burst that began with no instance ready or busy: its followers within a start find none
        # either, so instances may be started for them now, not one as each arrives; for as many as
        # a burst surely brings (the whole ones of its mean: a Poisson function's chance short gap
        # brings none, where a session's start brings dozens).
        cold = not any(i.phase in (Phase.BUSY, Phase.IDLE) for i in s.instances.values())
        ahead = min(len(arrivals) - min(queued, c.queue_simulated), int(coming)) if cold else 0
        best_m, (wait, first) = 0, waits(0)
        best = lam * wait
        for m in range(1, min(uncovered + ahead, c.max_starts) + 1):
            total, at = waits(m)
            cost = lam * total + m * 2 * gb * start
            if cost >= best:
                break
            best_m, best, first = m, cost, at
        if best_m > uncovered:
            return QueuePlan(starts=uncovered, ahead=best_m - uncovered)
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        starts = min(max(best_m, self.pool_target(s, f, now, run=run) - live), uncovered)
        if starts == uncovered or first is None or first == math.inf:
            return QueuePlan(starts=starts)
        return QueuePlan(
            starts=starts,
            why=f"wait ~{first - now:.0f} ms for a busy instance rather than a {start} ms start",
            recheck_ms=int(first + max(5, typical // 4)),
            expected_ms=int(first),
        )

    def _in_stead(self, s: FnState, f: FnStats, now: int, run: RunView) -> Prewarm:
        """Instances that went with their release, not by a keep-alive of the policy's (need_destroy, mostly: no
        keep-alive was decided for them), started again while the load clearly needs them (`pool_target` for the
        load half a standard error below its estimate, as a pool shrinks only past half of one above; those
        starting counted): a busy function's pool grows only for waiting requests, so without this it erodes
        death by death until every call waits for a start (dataSet_3's 8b83a83f, 246 of its 61,111 calls fatal,
        lost its ten instances in 15 s and then queued 50 calls for 3.8 s starts)."""
        gone = 0
        for i in s.instances.values():
            if i.phase is Phase.RETIRING and not i.keep_until_ms and (done := s.release_of(i.request_id)):
                gone += done.instance_id == i.id and done.at_ms == i.since_ms
        if not gone:
            return NO_PREWARM
        live = sum(1 for i in s.instances.values() if i.phase is not Phase.RETIRING)
        target = self.pool_target(s, f, now, margin=-0.5, run=run)
        if (short := min(gone, target - live)) <= 0:
            return NO_PREWARM
        return Prewarm(short, f"an instance went with its request, and the load needs {target}: one in its stead")

    def prewarm(self, s: FnState, f: FnStats, now: int, run: RunView = UNSEEN) -> Prewarm:
        if not s.nothing_live():
            return self._in_stead(s, f, now, run)  # else it grows only for waiting requests (`plan_queue`)
        if (soon := self._imminent(s, f, now, run)).count:
            return soon
        plan = self.return_plan(s, f, now, run)
        if plan is None:
            return NO_PREWARM
        count = plan.count
        begin = f.last_arrival_ms + int(plan.ready) - self.outlook(s, f, run).lead
        if begin > now:
            return Prewarm(next_ms=begin)
        expected = (f.last_arrival_ms + plan.ready - now) / 1000
        why = f"pre-warm: next arrival expected {expected:.3g}s from now"
        if leader := self._cue(s, f, now).leader:
            why += f" ({leader} came back, and this function follows it)"
        return Prewarm(count, why)


@dataclass(frozen=True)
class Delays:
    """What the system the function runs on makes a start cost, from what its events measured: recent starts
    (SlotWanted to ready, as the core saw them) and how late its timers were acted on (`FnStats.starts`,
    `FnStats.late`), and how much longer than their runs its requests held their instances (`FnStats.overheads`:
    the node's own time in a call). Offline, with no latency played, every start alike and no timer late: a lead
    of the start, no risk, no work.

    - `lead`: how long before an arrival to start its instance. An instance started `lead` ahead is late when
      its start and its timer's lateness D come to more. Past the longest D seen a new one comes one time in
      n + 1 (n starts seen), by about D's spread (its sd) more; holding one ms longer costs gb x 1 ms, a ms late
      costs lam: so the lead is the longest D seen plus sd x ln(lam / (gb (n + 1))) when that is positive (the
      newsvendor's quantile, P(D > lead) = gb / lam, on that tail).
    - `late`: the ms an arrival at the ready time is then expected to wait for its instance.
    - `work`: the node's own time a restart takes (its decisions, each appended: `restart_decisions`), priced as
      waiting: each decision as half a call's measured overhead (a call is two: its Assign and its Idle).

    A timer's lateness beyond the longest start is an outage (a node down, a partition moved), not a timer's: it
    is left out.
    """

    lead: int
    late: float = 0.0
    work: float = 0.0

    @classmethod
    def of(cls, f: FnStats, start: int, gb: float, lam: float, decisions: float) -> "Delays":
        starts = f.starts or (start,)
        longest = max(starts)
        late = [x for x in f.late if x < longest] if any(f.late) else []
        work = lam * decisions * _median(f.overheads) / 2 if any(f.overheads) else 0.0
        worst = longest + (max(late) if late else 0)
        spread = math.sqrt(_variance(starts) + _variance(late)) if late or min(starts) < longest else 0.0
        if not spread:
            return cls(worst, 0.0, work)
        tail = spread / (len(starts) + 1)  # expected ms past the longest, for a start at the longest
        ratio = lam / (gb * (len(starts) + 1))
        if ratio <= 1:
            return cls(worst, tail, work)
        return cls(worst + round(spread * math.log(ratio)), spread * gb / lam, work)


def _median(values: tuple[int, ...]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


def _variance(values: tuple[int, ...] | list[int]) -> float:
    """The population variance (0 for fewer than two values, or all alike)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return sum((x - mean) * (x - mean) for x in values) / len(values)


def _spares(s: FnState, f: FnStats, rate: float, gb: float, lam: float) -> int:
    """Instances kept beyond the load for those lost with their request (need_destroy).

    Deaths come at `rate` x the share of requests that kill their instance; one that finds no
    spare makes every arrival during a start wait. Keep the number of spares s that minimises
    memory x s + wait_gb x (deaths that find none) x (their wait), deaths being Poisson within a start.
    """
    st = f
    if not st.deaths or not rate:
        return 0
    deaths = rate * st.deaths / st.arrivals  # per ms
    start = start_ms(s, f)
    expected = deaths * start  # deaths within one start
    cost_of_one = rate * start * start / 2  # ms of waiting when no spare covers it
    best_s, best, tail, term = 0, math.inf, 1.0, math.exp(-expected)
    for spare in range(8):
        tail -= term  # P(more than `spare` deaths within a start)
        cost = gb * spare + lam * deaths * max(tail, 0.0) * cost_of_one
        if cost >= best:
            break
        best_s, best = spare, cost
        term *= expected / (spare + 1)
    return best_s


def _next_gap(s: FnState, f: FnStats, burst: int) -> NextGap:
    """The function's NextGap for its stats as they are (built from the one built for it last)."""
    return next_gap.recent.of(s.key, f.gaps, f.lulls, f.gap_hist, burst)


def _between(gaps: NextGap, burst: int, weight: float) -> NextGap:
    """`gaps` with `weight` (in gaps) spread alike over the half-octaves from a lull's (past `burst`) to its longest
    gap's where no gap came yet: a next gap there is possible, if rare, where the recent ones alone say never."""
    hist = gaps.hist
    if not weight or not hist:
        return gaps
    top = max(i for i, w in enumerate(hist) if w > 0)
    empty = [i for i in range(gap_bin(burst) + 1, top) if hist[i] <= 0]
    if not empty:
        return gaps
    filled = list(hist)
    for i in empty:
        filled[i] = weight / len(empty)
    return msgspec.structs.replace(gaps, hist=tuple(filled))


def _median_lag(lead: Leader) -> int:
    """How long after its leader's return the function is mostly called (the upper middle of its lags)."""
    return sorted(lead.lags)[len(lead.lags) // 2]


def _gb(s: FnState, f: FnStats) -> float:
    return (s.meta.memory_mb if s.meta else 1024) / 1024


def _death_share(s: FnState, f: FnStats) -> float:
    """The share of requests that kill their instance (need_destroy)."""
    return f.deaths / f.arrivals if f.arrivals else 0.0


def _busy(s: FnState, f: FnStats) -> float:
    """How long a request keeps an instance from the next one, on average: its run, and when it kills the
    instance (need_destroy), the start of another."""
    runs = f.runs
    return max(sum(runs) / len(runs), 1.0) + _death_share(s, f) * start_ms(s, f)


def _rate(s: FnState, f: FnStats, now: int | None = None) -> float:
    """Recent arrivals per ms; with `now`, the gap still open counts too (a lull lowers it)."""
    gaps = f.gaps
    if not gaps:
        return 0.0
    span = sum(gaps) + (max(0, now - f.last_arrival_ms) if now is not None else 0)
    return len(gaps) / max(span, 1)


def _burst(s: FnState, f: FnStats, start: int) -> Burst:
    """Arrivals per ms within a burst (gaps shorter than two starts), and how many more a burst brings once
    it has begun, on average: a gap is short with chance p, so p / (1 - p) (a busy function: all of its
    recent gaps)."""
    gaps = f.gaps
    near = [g for g in gaps if g <= 2 * start]
    if not near:
        return Burst(_rate(s, f), len(gaps))
    far = len(gaps) - len(near)
    return Burst(len(near) / max(sum(near), 1), len(near) / far if far else len(gaps))


def _shorter_than_seen(gaps: tuple[int, ...]) -> float:
    """Where a next gap shorter than every recent one would fall: below the shortest by as much as the
    recent gaps vary (the sd of their logs, at the kernel's outermost point); a clock's at the shortest."""
    if len(gaps) < 2:
        return 0.0
    logs = list(map(math.log, map(max, gaps, repeat(1))))
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum(map(math.pow, map(mean.__rsub__, logs), repeat(2.0))) / (len(logs) - 1))
    return min(gaps) * math.exp(-KERNEL[-1] * sd)


def _memoryless(gaps: tuple[int, ...], c: LearnedConfig) -> bool:
    """Gaps that vary as an exponential's do (a squared coefficient of variation near its 1): Poisson calls.
    Not calls that came at once (gaps of 0 ms): none can be shorter."""
    return (
        len(gaps) >= c.memoryless_from and min(gaps) > 0 and c.memoryless_scv_min <= scv(gaps) <= c.memoryless_scv_max
    )


def _when_free(s: FnState, f: FnStats, runs: list[int], start: int, now: int) -> list[float]:
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


# An exchange rate one may set. Its top is far above the most a run teaches (`max_wait_gb`): an operator
# with a latency objective may want fewer cold starts than 1000 buys (on dataSet_1, 4000 is at least as good
# on both cold-start rate and idle memory as fixed10, and 2750 as demo; docs/policies.md).
MIN_RATE, MAX_RATE = LearnedConfig().min_wait_gb, 1_000_000.0


def rate_problem(rate: float) -> str | None:
    """Why `rate` cannot be set as the exchange rate (`--exchange-rate`, a limits file's), or None when it can."""
    if not MIN_RATE <= rate <= MAX_RATE:  # NaN too
        return f"an exchange rate is {MIN_RATE:g} to {MAX_RATE:,.0f} GB·s of slot per second of waiting, got {rate}"
    return None


def with_rate(policy: Policy, rate: float | None) -> Policy:
    """`policy` at the exchange rate `rate` (None: as it is); only a policy whose config has one can take it."""
    if rate is None:
        return policy
    if not hasattr(policy.config, "exchange_rate"):
        raise ValueError(f"policy {policy.name} has no exchange rate (learned has)")
    return type(policy)(msgspec.structs.replace(policy.config, exchange_rate=rate), name=policy.name)
