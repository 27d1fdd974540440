"""The node's metrics are read from the controller's state when scraped (the scrape itself: tests/cli/test_up.py)."""

from scaler.controller.core.policy import get_policy
from scaler.controller.metrics import ControllerCollector
from scaler.controller.shell import Controller
from scaler.proto.commands import Assign
from scaler.proto.events import Meta
from tests.clocks import Stopped
from tests.stack import eventually


async def test_a_function_waiting_for_its_cold_start_and_the_snapshot_age(nats_url, tmp_path):
    clock = Stopped()
    controller = Controller(nats_url, get_policy("demo"), snapshot_every=1, clock=clock)
    await controller.start()
    try:
        families = {m.name: m for m in ControllerCollector(controller).collect()}
        assert "scaler_snapshot_age_seconds" not in families  # none written yet
        meta = Meta(memory_mb=1024, runtime="python", timeout_s=60)
        await controller.handle(Assign(key="f", request_id="r1", meta=meta))  # no platform: it stays cold
        await eventually(lambda: controller.snapshot_saved_s is not None)
        clock.advance(3000)  # 3 s of a 1 GB slot wanted since the Assign
        got = {
            (s.name, tuple(s.labels.values())): s.value
            for m in ControllerCollector(controller).collect()
            for s in m.samples
        }
        assert got[("scaler_instances", ("f", "creating"))] == 1
        assert got[("scaler_instances", ("f", "idle"))] == 0
        assert got[("scaler_requests_waiting", ("f",))] == 1
        assert got[("scaler_cold_starts_total", ("f",))] == 1
        assert got[("scaler_functions", ())] == 1
        assert got[("scaler_slot_gb_seconds_total", ("f",))] == 3.0
        assert 0 <= got[("scaler_snapshot_age_seconds", ())] < 60
    finally:
        await controller.stop()
