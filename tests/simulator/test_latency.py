"""The latency model: measured on a live run's records and events, and played offline where each delay belongs."""

import pytest

from scaler.controller.core.policy import get_policy
from scaler.controller.core.policy.base import FixedConfig, FixedKeepAlive
from scaler.controller.ledger import PLAN
from scaler.proto import events as e
from scaler.runtime.clock import Clock
from scaler.simulator import latency
from scaler.simulator.dataset import load_dataset
from scaler.simulator.latency import PARTS, CallTimes, Latency, Sampler, SlotTimes, measure, percentiles
from scaler.simulator.live import LiveRun
from scaler.simulator.offline import Simulation, simulate
from tests.simulator.test_simulate import SMOKE, gentle, meta, request, write_dataset
from tests.stack import Stack

META = e.Meta(memory_mb=1024)


def constant(**ms: float) -> Latency:
    """A model whose every draw of a part is the value given (the others 0)."""
    return Latency(source="constant", **{part: (float(v),) * 101 for part, v in ms.items()})


def test_a_part_is_kept_as_its_percentiles_and_drawn_the_same_for_a_seed():
    q = percentiles(range(1001))
    assert len(q) == 101 and q[0] == 0 and q[50] == 500 and q[100] == 1000
    assert percentiles([]) == ()
    model = Latency(assign_in=q)
    one, two, other = Sampler(model, 7), Sampler(model, 7), Sampler(model, 8)
    draws = [one.draw("assign_in") for _ in range(200)]
    assert draws == [two.draw("assign_in") for _ in range(200)]
    assert draws != [other.draw("assign_in") for _ in range(200)]
    assert all(0 <= d <= 1000 for d in draws) and 300 < sum(draws) / len(draws) < 700
    assert Sampler(model).draw("timer") == 0  # not measured: none


def test_a_model_of_no_latency_plays_as_offline_does(tmp_path):
    zero = constant(**dict.fromkeys(PARTS, 0))
    for folder, policy in ((SMOKE, "learned"), (gentle(tmp_path / "g"), "demo")):
        dataset = load_dataset(folder)
        played = simulate(dataset, get_policy(policy), latency=zero).stats()
        assert played == simulate(dataset, get_policy(policy)).stats()


def test_each_delay_lands_where_it_belongs(tmp_path):
    # One function, a 1 s keep-alive, two calls 10 s apart: each a cold start.
    folder = write_dataset(
        tmp_path / "t", [meta("f", memory=1024, init=100)], [request(0, "f", 50), request(10_000, "f", 50)]
    )
    model = constant(
        assign_in=5, assign_out=7, idle_in=3, idle_out=2, dispatch=10, start_extra=20, notify=4, destroy=9, timer=30
    )
    sim = Simulation(load_dataset(folder), FixedKeepAlive(FixedConfig(keep_alive_ms=1_000)), latency=model)
    run = sim.run()
    # the Assign reaches the core at 5, which starts an instance: CreateSlot at 15, ready at 15 + 100 + 100 + 20, its
    # report at the core 4 ms later, where it is assigned, and the answer reaches the platform 7 ms after that
    assert [i.schedule_ms for i in run.invocations] == [246, 246]
    assert all(i.cold for i in run.invocations)
    assert [i.idle_ms for i in run.invocations] == [5, 5]
    # each slot from its CreateSlot (15 ms after the core wanted it) to its DestroySlot: the Idle at the core 50 + 3 ms
    # after the answer, kept 1 s, its timer 30 ms late, the destruction 9 ms on its way
    assert run.slot_gb_s == pytest.approx(2 * (299 + 1_000 + 30 + 9 - 15) / 1000)
    # and the function's features measure the system as the core saw it
    f = sim.ledger.features_of("f")
    assert f.starts == (234, 234)  # wanted at 5, ready at the core at 239
    assert f.late == (30, 30)
    assert f.overheads == (10, 10)  # held 7 ms (the answer out) and 3 ms (the Idle in) longer than it ran


def test_a_run_measures_each_part_from_the_platforms_record_and_the_cores_events():
    calls = [CallTimes("r1", assign_start=1_000, assign_end=1_300, idle_start=1_400, idle_end=1_409)]
    slots = [SlotTimes("f-1", created_ms=1_020, ready_ms=1_250, destroyed_ms=5_012, nominal_ms=200)]
    batches = [
        e.Batch(
            key="f",
            at_ms=1_004,
            cause="assign:r1",
            events=[
                e.RequestArrived(at_ms=1_004, request_id="r1"),
                e.SlotWanted(at_ms=1_004, instance_id="f-1", meta=META, for_request="r1"),
            ],
        ),
        e.Batch(
            key="f",
            at_ms=1_262,
            cause="ready:f-1",
            events=[
                e.InstanceReady(at_ms=1_262, instance_id="f-1", slot_id="s"),
                e.Assigned(at_ms=1_262, request_id="r1", instance_id="f-1"),
            ],
        ),
        e.Batch(
            key="f",
            at_ms=1_402,
            cause="idle:r1",
            events=[e.Released(at_ms=1_402, request_id="r1", instance_id="f-1")],
            wake_ms=5_000,
        ),
        e.Batch(  # the timer, 3 ms late
            key="f",
            at_ms=5_003,
            cause=PLAN,
            events=[e.InstanceRetired(at_ms=5_003, instance_id="f-1", slot_id="s", reason="expired")],
        ),
    ]
    model = measure(calls, slots, batches, "a test")
    assert {part: getattr(model, part)[50] for part in PARTS} == {
        "assign_in": 4,
        "assign_out": 38,
        "idle_in": 2,
        "idle_out": 7,
        "dispatch": 16,
        "start_extra": 30,
        "notify": 12,
        "destroy": 9,
        "timer": 3,
    }
    assert model.samples == dict.fromkeys(PARTS, 1)


def test_a_model_is_written_and_read_back(tmp_path):
    model = constant(assign_in=3, timer=1)
    latency.dump(model, tmp_path / "m.json")
    assert latency.load(tmp_path / "m.json") == model
    (tmp_path / "bad.json").write_text("{}]")
    with pytest.raises(ValueError, match="not a latency model"):
        latency.load(tmp_path / "bad.json")


async def test_a_live_runs_model_splits_each_call_at_the_cores_decision(nats_url, tmp_path):
    # What holds however loaded the machine is: a warm call's time in and out add up to the call as the platform
    # timed it (the core decides it in one go), every call and start is measured, and no part is negative. How many
    # starts there are is the run's: a second apart, each function's calls find the one before released, but a
    # loaded machine may still not have stored a release in time (then that call is a start of its own).
    folder = write_dataset(
        tmp_path / "t",
        [meta("a", memory=256, init=50), meta("b", memory=512, init=80)],
        [request(0, "a"), request(100, "b"), request(1_400, "a"), request(2_400, "a"), request(2_500, "b")],
    )
    dataset = load_dataset(folder)
    clock = Clock(1.0)
    async with Stack(nats_url, metas=dataset.metas, create_latency_ms=100, clock=clock, policy="demo") as stack:
        driver = LiveRun(dataset, stack.scaler, stack.stub, stack.clock, tail_ms=300)
        run = await driver.run()
        slots = driver.slot_times()
    assert not driver.errors() and run.stats().failed_requests_count == 0
    model = measure(driver.call_times(), slots, await latency.read_batches(nats_url), "a live test")
    for part in ("assign_in", "assign_out", "idle_in", "idle_out"):
        assert model.samples[part] == 5, part
    assert model.samples["dispatch"] == model.samples["notify"] == len(slots) == run.slots_created >= 2
    assert all(v >= 0 for part in PARTS for v in getattr(model, part))
    arrived, assigned = {}, {}
    for stored in await latency.read_batches(nats_url):
        for ev in stored.events:
            if isinstance(ev, e.RequestArrived):
                arrived[ev.request_id] = ev.at_ms
            elif isinstance(ev, e.Assigned):
                assigned[ev.request_id] = ev.at_ms
    warm = [c for c in driver.call_times() if arrived[c.request_id] == assigned[c.request_id]]
    assert len(warm) == 5 - run.slots_created  # demo starts an instance for the call that waits for it alone
    for c in warm:
        into, out = arrived[c.request_id] - c.assign_start, c.assign_end - assigned[c.request_id]
        assert into >= 0 and out >= 0 and into + out == c.assign_end - c.assign_start


def test_a_scaler_without_events_is_measured_on_the_platforms_side_alone():
    calls = [
        CallTimes("cold", assign_start=1_000, assign_end=1_300, idle_start=1_400, idle_end=1_406, instance_id="i1"),
        CallTimes("warm", assign_start=2_000, assign_end=2_004, idle_start=2_100, idle_end=2_103, instance_id="i1"),
    ]
    slots = [SlotTimes("i1", created_ms=1_020, ready_ms=1_250, destroyed_ms=None, nominal_ms=200)]
    model = measure(calls, slots, None, "records")
    assert model.assign_out[50] == 4 and model.idle_in == percentiles([6, 3])
    assert model.dispatch[50] == 20 and model.notify[50] == 300 - 250 - 4 and model.start_extra[50] == 30
    assert not model.assign_in and not model.timer and "the platform's side alone" in model.source
