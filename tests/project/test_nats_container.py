"""The integration suite (tests/system/test_rules.py) against NATS in a container: compose.yaml's nats
service, its image and command, waited for through its health check's endpoint.

Runs when a Docker engine is reachable and has the images (compose's nats image, NATS_IMAGE if set as
compose reads it, and testcontainers' Ryuk unless TESTCONTAINERS_RYUK_DISABLED=true), pulled if need
be; otherwise every test here is skipped, saying why.
"""

import os
import re
import time
import urllib.request
from pathlib import Path

import nats
import pytest

from tests import compose as c
from tests.system import test_rules

# The same tests, collected here too, so that they get this module's nats_url.
globals().update({name: test for name, test in vars(test_rules).items() if name.startswith("test_")})


def docker_problem() -> str | None:
    """Why no Docker engine can be used, or None. Answers within a few seconds, never hangs."""
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception as e:
        return str(e) or type(e).__name__
    return None


def image_problem(image: str) -> str | None:
    """Why the engine cannot have `image`, here or pulled, or None. With no registry reachable the
    pull fails at once; the tests are then skipped rather than errors."""
    import docker

    client = docker.from_env(timeout=300)
    try:
        client.images.get(image)
        return None
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(image)
    except docker.errors.APIError as e:
        return f"cannot pull {image}: {e.explanation or e}"
    return None


def with_configs(container, compose: dict, service: dict, folder: Path):
    """The files compose mounts from its `configs` (an inline `content`, or a `file`), bind-mounted read-only
    where the service reads them: a local engine sees this machine's folders."""
    for ref in service.get("configs", []):
        config = compose["configs"][ref["source"]]
        host = folder / ref["source"]
        host.write_bytes(config["content"].encode() if "content" in config else Path(config["file"]).read_bytes())
        host.chmod(0o644)
        container = container.with_volume_mapping(str(host), ref["target"], "ro")
    return container


@pytest.fixture(scope="module")
def nats_container(tmp_path_factory):
    if problem := docker_problem():
        pytest.skip(f"no Docker engine reachable ({problem}): these rules run only on the embedded nats-server")
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer

    compose = c.load(os.environ)
    service = compose["services"]["nats"]  # the image and command compose would run here, with its config
    images = [service["image"]] + ([] if testcontainers_config.ryuk_disabled else [testcontainers_config.ryuk_image])
    if problems := [p for p in map(image_problem, images) if p]:
        pytest.skip(f"{'; '.join(problems)}: these rules run only on the embedded nats-server")
    url = next(a for a in service["healthcheck"]["test"] if a.startswith("http"))
    monitor = int(re.search(r":(\d+)/", url).group(1))
    (client,) = c.listen_ports("nats", service)
    container = DockerContainer(service["image"]).with_command(service["command"])
    container = with_configs(container, compose, service, tmp_path_factory.mktemp("nats-configs"))
    try:  # stopped (and removed) even when it fails to start or to become healthy
        container.with_exposed_ports(client, monitor).start()
        host = container.get_container_host_ip()
        health = re.sub(r"//[^/]+/", f"//{host}:{container.get_exposed_port(monitor)}/", url)
        deadline = time.monotonic() + 60
        while True:  # what compose's health check asks, from outside
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{service['image']} never answered {url} with 200"
            time.sleep(0.2)
        yield f"nats://{host}:{container.get_exposed_port(client)}"
    finally:
        container.stop()


@pytest.fixture
async def nats_url(nats_container):
    """The container's NATS with an empty JetStream, as fresh for each test as the embedded server is."""
    nc = await nats.connect(nats_container)
    try:
        js = nc.jetstream()
        for stream in await js.streams_info():
            await js.delete_stream(stream.config.name)
    finally:
        await nc.close()
    yield nats_container
