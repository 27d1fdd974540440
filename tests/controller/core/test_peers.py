"""The published peers' rules, pinned: SPES (its classes, windows, pre-warm and unload), RainbowCake (its
mean gap, pre-warm and keep-alive bound), CIDRE (queueing for a busy instance, and its cold path)."""

import pytest

from scaler.controller.core.features import START_MARGIN_MS, UNKNOWN_START_MS, FnStats
from scaler.controller.core.policy import get_policy, spes
from scaler.controller.core.policy import rainbowcake as rc
from scaler.controller.core.state import FnState, Instance, Phase
from scaler.proto import commands as c
from scaler.proto import events as e
from tests.controller.core.factories import KEY, META, assign, idle, ready, run
from tests.controller.core.given import given

SPES, RAINBOWCAKE, CIDRE = get_policy("spes"), get_policy("rainbowcake"), get_policy("cidre")


def state(meta: e.Meta = META, instances: tuple[Instance, ...] = (), **stats) -> tuple[FnState, FnStats]:
    """A function's state and its features, as a policy is given them."""
    return FnState(key=KEY, meta=meta, instances={i.id: i for i in instances}), FnStats(**stats)


def idle_instance(since: int, request: str = "r0", wanted: int = 0, id: str = "fn-1") -> Instance:
    return Instance(
        id=id, phase=Phase.IDLE, since_ms=since, memory_mb=META.memory_mb, request_id=request, wanted_ms=wanted
    )


# --- SPES -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runs", "kind"),
    [
        ((0, 0, 0, 0, 0, 0, 0, 0, 0, 1), spes.Kind.ALWAYS_WARM),
        ((5, 5, 6, 5, 5, 4, 5, 5), spes.Kind.REGULAR),  # a 60 s timer in 10 s bins
        ((0, 3, 1, 4, 2, 0, 3, 4), spes.Kind.DENSE),
        ((9, 30, 9, 18, 30, 10, 18, 9), spes.Kind.APPROX_REGULAR),  # three periods
        ((1, 40, 7, 90, 13, 25, 60, 3), spes.Kind.UNKNOWN),
        ((5, 5, 5), spes.Kind.UNKNOWN),  # too few to tell
    ],
)
def test_spes_classifies_a_function_by_its_quiet_bins(runs, kind):
    assert spes.classify(runs) is kind


def test_spes_predicts_a_regular_function_at_its_median_run_after_the_last_active_bin():
    s = state(quiet_bins=(5,) * 8, arrivals=9, last_arrival_ms=103_000)  # bin 10
    (w,) = spes.windows(*s, spes.Kind.REGULAR)
    assert (w.start_ms, w.end_ms) == (160_000, 170_000)  # bin 16, no spread


def test_spes_spreads_a_window_by_the_std_at_most_two_bins():
    s = state(quiet_bins=(2, 12) * 4, arrivals=9, last_arrival_ms=100_000)
    (w,) = spes.windows(*s, spes.Kind.REGULAR)  # median 7, std 5 -> 2 bins
    assert (w.start_ms, w.end_ms) == (160_000, 210_000)  # bins 16-20 around bin 18


def test_spes_prewarms_two_bins_before_a_window_and_holds_the_instance_through_it():
    s = state(quiet_bins=(5,) * 8, arrivals=9, last_arrival_ms=103_000, start_ms=150)
    assert SPES.prewarm(*s, 130_000).next_ms == 140_000
    assert SPES.prewarm(*s, 140_000).count == 1
    warmed = Instance(id="fn-2", phase=Phase.IDLE, since_ms=140_150, memory_mb=512, wanted_ms=140_000)
    assert SPES.keep_alive(*s, warmed, 140_150).until_ms == 170_000
    assert SPES.prewarm(*s, 170_000).count == 0  # the window passed with no call: no second pre-warm


@pytest.mark.parametrize(
    ("runs", "until"),
    [
        ((5,) * 8, 130_000),  # regular: unloaded after 1 idle bin (the rest of bin 11, then bin 12)
        ((0, 3, 1, 4, 2, 0, 3, 4), 170_000),  # dense: after 5
        ((1, 40, 7, 90, 13, 25, 60, 3), 115_000 + 600_000),  # unknown: 10 minutes
    ],
)
def test_spes_unloads_an_idle_instance_by_its_class(runs, until):
    s = state(quiet_bins=runs, arrivals=9, last_arrival_ms=113_000)
    assert SPES.keep_alive(*s, idle_instance(115_000), 115_000).until_ms == until


def test_spes_never_unloads_an_always_warm_function_while_it_stays_so():
    s = state(quiet_bins=(0,) * 10, arrivals=11, last_arrival_ms=100_000)
    inst = idle_instance(100_000)
    keep = SPES.expire(*s, inst, 1_000_000)
    assert keep is not None and keep.until_ms > 1_000_000
    assert SPES.expire(*state(quiet_bins=(5,) * 10, arrivals=11, last_arrival_ms=100_000), inst, 1_000_000) is None


def test_the_quiet_bins_feature_counts_the_bins_without_a_call():
    s, ds = run(assign("r1"), at=5_000, policy=SPES)
    for t, r in ((8_000, "r2"), (25_000, "r3"), (61_000, "r4")):
        s, ds = run(assign(r), at=t, policy=SPES, s=s, f=ds[-1].features)
    # bin 0 -> 2 (bin 1 quiet), 2 -> 6 (bins 3-5); a second call in bin 0 adds none
    assert ds[-1].features.quiet_bins == (1, 3)


# --- RainbowCake ------------------------------------------------------------------------------


def test_rainbowcake_mean_gap_is_the_last_six_arrivals_span_to_now_over_six():
    s = state(arrivals=7, last_arrival_ms=60_000, gaps=(10_000,) * 6)
    assert rc.arrivals(*s) == [10_000, 20_000, 30_000, 40_000, 50_000, 60_000]
    assert rc.mean_gap_s(*s, 60_000) == pytest.approx(50 / 6)


def test_rainbowcake_prewarms_at_the_exponentials_80th_percentile_when_none_is_idle():
    s = state(arrivals=7, last_arrival_ms=60_000, gaps=(10_000,) * 6, start_ms=150)
    due = 60_000 + 14_000  # ceil(1.609 x 8.33 s)
    assert RAINBOWCAKE.prewarm(*s, 61_000).next_ms == due
    assert RAINBOWCAKE.prewarm(*s, due).count == 1
    with_idle = state(arrivals=7, last_arrival_ms=60_000, gaps=(10_000,) * 6, instances=(idle_instance(61_000),))
    assert RAINBOWCAKE.prewarm(*with_idle, due).count == 0


@pytest.mark.parametrize(
    ("gap_ms", "memory_mb", "start_ms", "keep_s"),
    [
        (10_000, 512, 150, 60),  # 1.61 x 8.3 s < 60 s: the floor
        (100_000, 512, 150, 1),  # 1.61 x 83 s > UB = ceil(0.996 x 0.15 / (0.004 x 512)) = 1 s
        (100_000, 128, 15_000, 30),  # UB = ceil(0.996 x 15 / (0.004 x 128)) = 30 s
        (100_000, 128, 0, 135),  # no start seen: UB is 600 s, ceil(1.61 x 83.3 s)
    ],
)
def test_rainbowcake_keep_alive_is_the_quantile_floored_at_60s_and_cut_to_the_cost_bound(
    gap_ms, memory_mb, start_ms, keep_s
):
    meta = e.Meta(memory_mb=memory_mb, runtime="python", timeout_s=60)
    s = state(meta=meta, arrivals=7, last_arrival_ms=6 * gap_ms, gaps=(gap_ms,) * 6, start_ms=start_ms)
    now = 6 * gap_ms
    assert RAINBOWCAKE.keep_alive(*s, idle_instance(now), now).until_ms == now + keep_s * 1000


# --- CIDRE ------------------------------------------------------------------------------------


def busy(since: int = 0) -> Instance:
    return Instance(id="fn-1", phase=Phase.BUSY, since_ms=since, memory_mb=512, request_id="r0", wanted_ms=0)


def test_cidre_queues_for_a_busy_instance_while_queueing_costs_little_against_execution():
    s = state(instances=(busy(),), queued=(100,) * 10, runs=(100,) * 10, arrivals=10)  # 0.8 x 100 <= 100
    plan = CIDRE.plan_queue(*s, 1, 50)
    assert plan.starts == 0 and plan.expected_ms == 100


def test_cidre_starts_a_cold_instance_at_once_when_queueing_outweighs_execution():
    s = state(instances=(busy(),), queued=(200,) * 10, runs=(100,) * 10, arrivals=10)  # 0.8 x 200 > 100
    assert CIDRE.plan_queue(*s, 2, 50).starts == 2


def test_cidre_means_cover_the_last_ten_requests_only():
    s = state(instances=(busy(),), queued=(10_000,) * 5 + (0,) * 10, runs=(100,) * 10, arrivals=15)
    assert CIDRE.plan_queue(*s, 1, 50).starts == 0


def test_cidre_starts_when_there_is_no_busy_instance_to_queue_for():
    assert CIDRE.plan_queue(*state(), 1, 0).starts == 1


def test_cidre_the_first_instance_free_serves_the_waiting_request_and_the_other_goes_idle():
    s = state(instances=(busy(),), queued=(200,) * 10, runs=(100,) * 10, arrivals=10)
    s, f = FnState(key=s[0].key, meta=s[0].meta, instances=s[0].instances, started=1), s[1]
    why = "queue for a busy instance and start one, first free serves (0.8 x 200 > 100 ms)"
    arrive = (
        given(s=s, f=f, policy=CIDRE)
        .when(assign("r1"), at=1_000)
        .then(
            events=[  # queues and starts at once
                e.RequestArrived(at_ms=1_000, request_id="r1", reply_to="to-r1"),
                e.SlotWanted(at_ms=1_000, instance_id="fn-2", meta=META, for_request="r1", reason=why),
            ],
            wake_ms=1_000 + UNKNOWN_START_MS + START_MARGIN_MS,
        )
    )
    free = (
        given(s=arrive, policy=CIDRE)
        .when(idle("r0", "fn-1"), at=1_010)
        .then(
            events=[  # the busy one won
                e.Released(at_ms=1_010, request_id="r0", instance_id="fn-1"),
                e.Assigned(at_ms=1_010, request_id="r1", instance_id="fn-1"),
            ],
            replies=[
                c.Reply(to="to-idle-r0", request_id="r0", instance_id="fn-1"),
                c.Reply(to="to-r1", request_id="r1", instance_id="fn-1"),
            ],
            wake_ms=1_000 + UNKNOWN_START_MS + START_MARGIN_MS,
        )
    )
    given(s=free, policy=CIDRE).when(ready("fn-2"), at=1_020).then(
        events=[  # the new one idles
            e.InstanceReady(at_ms=1_020, instance_id="fn-2", slot_id="s1", create_ms=100, init_ms=50),
            e.KeptAlive(
                at_ms=1_020,
                instance_id="fn-2",
                until_ms=1_020 + 600_000,
                why="CIDRE: no memory cap to evict under, 10-minute keep-alive",
            ),
        ],
        wake_ms=1_010 + META.timeout_s * 1000 + 30_000,  # r1's lease on fn-1
    )


def test_the_queued_feature_counts_only_waits_for_an_instance_that_existed():
    s, ds = run(assign("r1"), ready("fn-1"), assign("r2"), at=0, step=10, policy=CIDRE)
    assert ds[-1].features.queued == (0,)  # r1 waited for the instance started for it: not queueing
    s, ds = run(idle("r1", "fn-1"), at=100, policy=CIDRE, s=s, f=ds[-1].features)
    assert ds[-1].features.queued == (0, 80)  # r2 came at 20 and queued for fn-1 until 100
