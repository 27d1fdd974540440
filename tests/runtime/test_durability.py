"""An acknowledgement means on disk: every nats-server we start syncs every write, a node says what it runs
under, and one that runs on a NATS that does not sync says so once (unless told it is intended)."""

import argparse
import logging

import pytest

from scaler.controller import __main__ as controller_main
from scaler.controller.core.policy import get_policy
from scaler.controller.metrics import ControllerCollector
from scaler.controller.shell import Controller
from scaler.runtime import durability
from scaler.runtime.bus import connected
from scaler.runtime.durability import Sync
from scaler.runtime.natsd import NatsCluster, NatsServer

DEMO = get_policy("demo")


async def test_the_embedded_server_syncs_every_write_and_one_told_otherwise_does_not(tmp_path):
    async with NatsServer(tmp_path / "synced") as synced, NatsServer(tmp_path / "lax", sync_always=False) as lax:
        assert await durability.server_sync([synced.monitor_url]) is Sync.ALWAYS
        assert await durability.server_sync([lax.monitor_url]) is Sync.INTERVAL
        assert await durability.server_sync([synced.monitor_url, lax.monitor_url]) is Sync.INTERVAL
    assert await durability.server_sync([synced.monitor_url]) is Sync.UNKNOWN  # gone: nobody answers


def test_where_to_ask_by_default_is_each_nats_host_on_the_monitoring_port():
    url = "nats://a:4222,nats://b:4222,nats://a:4223"
    assert durability.monitor_urls(url) == ["http://a:8222", "http://b:8222"]
    assert durability.monitor_urls(url, "http://m:1/,http://n:2") == ["http://m:1", "http://n:2"]


def sync_gauge(controller: Controller) -> float:
    (metric,) = [m for m in ControllerCollector(controller).collect() if m.name == "scaler_nats_sync_always"]
    return metric.samples[0].value


async def started(url: str, monitor: str, caplog, **kw) -> tuple[str, list[str], float]:
    controller = Controller(url, DEMO, nats_monitor=monitor, **kw)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        line = await controller.start()
        gauge = sync_gauge(controller)
        await controller.stop()
    return line, [r.getMessage() for r in caplog.records if "sync" in r.getMessage()], gauge


async def test_a_node_says_its_durability_and_warns_once_on_a_nats_that_does_not_sync(tmp_path, caplog):
    async with NatsServer(tmp_path / "synced") as synced:
        line, warned, gauge = await started(synced.url, synced.monitor_url, caplog)
    assert "every write synced to disk, 1 replica" in line and warned == [] and gauge == 1
    async with NatsServer(tmp_path / "lax", sync_always=False) as lax:
        line, warned, gauge = await started(lax.url, lax.monitor_url, caplog)
        assert "writes synced to disk only every sync_interval" in line and gauge == 0
        assert len(warned) == 1 and "does not sync every write" in warned[0] and "--nats-unsynced" in warned[0]
        _, warned, gauge = await started(lax.url, lax.monitor_url, caplog, nats_unsynced=True)
        assert warned == [] and gauge == 0, "intended: no warning, the metric still tells"
        line, warned, gauge = await started(lax.url, "http://127.0.0.1:1", caplog)
        assert "is unknown" in line and len(warned) == 1 and "cannot tell" in warned[0] and gauge == -1


async def test_on_a_cluster_streams_and_buckets_get_three_replicas_unless_told_otherwise(tmp_path):
    async with NatsCluster(tmp_path / "cluster") as cluster:
        monitors = ",".join(s.monitor_url for s in cluster.servers)
        controller = Controller(cluster.url, DEMO, nats_monitor=monitors)
        line = await controller.start()
        await controller.stop()
        assert "every write synced to disk, 3 replicas" in line
        async with connected(cluster.url, "test") as nc:
            js = nc.jetstream()
            assert (await js.stream_info("EVENTS")).config.num_replicas == 3
            for store in ("KV_scaler_leases", "KV_scaler_nodes", "KV_scaler_tenants", "OBJ_scaler_snapshots"):
                assert (await js.stream_info(store)).config.num_replicas == 3, store


@pytest.mark.parametrize("count", ["2", "4"])
def test_an_even_replica_count_is_refused_at_the_command_line(count, capsys):
    parser = argparse.ArgumentParser()
    controller_main.add_options(parser)
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["--replicas", count])
    assert refused.value.code == 2
    assert "a write needs a quorum" in capsys.readouterr().err
    assert parser.parse_args(["--replicas", "3"]).replicas == 3
