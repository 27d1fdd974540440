"""compose.yaml as the tests read it: interpolated as `docker compose` does, each of our services
parsed by its own component's parser, and every address mapped onto loopback.

There is no Docker engine here, so this is how compose.yaml is checked: against the components
themselves (tests/project/test_compose.py) and by starting its services as local processes.
"""

import argparse
import importlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from unittest import mock

import yaml

from scaler import cli
from scaler.runtime import service as component_service
from scaler.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
SIM_ENV = ROOT / "sim.env"  # the `sim` profile's variables: `docker compose --env-file sim.env --profile sim up`
TLS = ROOT / "compose.tls.yaml"  # `docker compose -f compose.yaml -f compose.tls.yaml up`: TLS on every hop

LOOPBACK = ("0.0.0.0", "127.0.0.1", "localhost")  # a service's own address, as it appears in its own settings
ADDRESS = re.compile(r"\b([\w.-]+):(\d+)\b")  # host:port, also inside a URL
VARIABLE = re.compile(r"\$(\$|\{([^}]*)\}|\w+)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$$`; anything else is an error here."""

    def value(m: re.Match) -> str:
        if m.group(1) == "$":
            return "$"
        inner = m.group(2)
        if inner is None:
            raise ValueError(f"write ${{{m.group(1)}}}, not ${m.group(1)}: {text!r}")
        parts = re.fullmatch(r"(\w+)(?:(:?-)(.*))?", inner)
        if parts is None:
            raise ValueError(f"${{{inner}}} is not a form these tests understand: {text!r}")
        name, op, default = parts.groups()
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        if name not in env:
            raise ValueError(f"${{{name}}} has no default and is not set: {text!r}")
        return env[name]

    return VARIABLE.sub(value, text)


def read_env_file(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(n, env) for n in node]
    if isinstance(node, dict):
        return {k: _resolve(v, env) for k, v in node.items()}
    return node


def load(env: Mapping[str, str] | None = None, overlays: tuple[Path, ...] = ()) -> dict:
    """compose.yaml (and `overlays` over it, as `-f compose.yaml -f ...`) with variables substituted from `env`."""
    merged = yaml.safe_load(COMPOSE.read_text())
    for overlay in overlays:
        merged = merge(merged, yaml.safe_load(overlay.read_text()))
    return _resolve(merged, env or {})


BY_TARGET = {"volumes", "configs"}  # lists compose merges by the container path, the others it replaces


def merge(base: Any, over: Any, key: str = "") -> Any:
    """Compose's merge of one file over another: mappings key by key, volumes and configs by target."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: merge(base[k], v, k) if k in base else v for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    if key in BY_TARGET and isinstance(base, list) and isinstance(over, list):
        kept = {_target(x): x for x in base} | {_target(x): x for x in over}
        return list(kept.values())
    return over


def _target(entry: Any) -> str:
    return entry["target"] if isinstance(entry, dict) else str(entry).split(":")[1]


def enabled(compose: dict, profiles: set[str] = frozenset()) -> dict[str, dict]:
    """The services `docker compose --profile ...` starts: those without profiles, and those of `profiles`."""
    services = compose["services"]
    return {n: s for n, s in services.items() if not s.get("profiles") or set(s["profiles"]) & profiles}


def start_order(services: dict[str, dict]) -> list[str]:
    """Each service after what it depends on, otherwise in file order."""
    order: list[str] = []
    while len(order) < len(services):
        ready = [n for n, s in services.items() if n not in order and set(s.get("depends_on", {})) <= set(order)]
        if not ready:
            raise ValueError(f"depends_on has a cycle among {set(services) - set(order)}")
        order.append(ready[0])
    return order


def option(command: list[str], flag: str) -> str:
    """The value after `flag` in a command line."""
    return command[command.index(flag) + 1]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def wheel_packages() -> list[str]:
    """The package patterns pyproject.toml puts in the wheel (and so in the image)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["packages"]["find"]["include"]


@dataclass
class Parsed:
    """One of our services as its component sees it: the options it parsed and the variables it read."""

    args: argparse.Namespace
    reads: set[str]  # every SCALER_* variable the component's parser looks up


IMAGE = "scaler:latest"  # the one image of our services, built from the Dockerfile


def is_ours(service: dict) -> bool:
    return service.get("image") == IMAGE


def is_part(service: dict) -> bool:
    """Runs one component: `python -m <part>` (the alternative is a `scaler` subcommand)."""
    return service["command"][:2] == ["python", "-m"]


def parse(name: str, service: dict) -> Parsed:
    """Run the service's command through its component's own parser, with the service's environment.

    The parser is built while service.env records what it is asked for, so `reads` is exactly the
    set of variables the component honours. A bad flag or value fails as it would at start.
    """
    command = service["command"]
    environment = {k: str(v) for k, v in service.get("environment", {}).items()}
    reads: set[str] = set()

    def env(var: str, default: str) -> str:
        reads.add(f"SCALER_{var}")
        return environment.get(f"SCALER_{var}", default)

    if is_part(service):
        build = importlib.import_module(f"{command[2]}.__main__").build_parser
        argv = command[3:]
    elif command[0] == "scaler":
        build = cli.build_parser
        argv = command[1:]
    else:
        raise ValueError(f"{name}: {command} is neither `python -m <part>` nor `scaler ...`")
    with mock.patch.object(component_service, "env", env):
        parser = build()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        raise ValueError(f"{name}: {command} does not parse (exit {e.code}), see stderr") from None
    for action in parser._actions:  # argparse checks the choices of flags given, not of defaults from variables
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if action.choices is not None and any(v not in action.choices for v in values):
            raise ValueError(f"{name}: {action.dest}={value!r} is not one of {sorted(action.choices)}")
    return Parsed(args, reads)


def listen_ports(name: str, service: dict) -> set[int]:
    """Where a service accepts connections: its component's --listen, or what compose says it exposes."""
    exposed = {int(p) for p in service.get("expose", [])}
    if is_ours(service):
        args = parse(name, service).args
        listen, metrics = getattr(args, "listen", None), getattr(args, "metrics_port", None)
        return exposed | ({port_of(listen)} if listen else set()) | ({metrics} if metrics else set())
    return exposed


def references(service: dict) -> list[tuple[str, int]]:
    """Every other host:port in a service's environment and command (hosts not yet checked to be services)."""
    texts = [str(v) for v in service.get("environment", {}).values()] + [str(a) for a in service.get("command", [])]
    return [(host, int(port)) for text in texts for host, port in ADDRESS.findall(text) if host not in LOOPBACK]


def volume_source(service: dict, target: str) -> str | None:
    """What is mounted at `target` in the service (a volume name or a host path), if anything."""
    for volume in service.get("volumes", []):
        source, mounted, *_ = volume.split(":")
        if mounted == target:
            return source
    return None


def host_path(service: dict, path: str) -> Path | None:
    """Where a path inside the container is on this machine, through a bind mount of the service."""
    p = PurePosixPath(path)
    for volume in service.get("volumes", []):
        source, mounted, *_ = volume.split(":")
        if source.startswith((".", "/")) and (p == PurePosixPath(mounted) or PurePosixPath(mounted) in p.parents):
            return (ROOT / source / p.relative_to(mounted)).resolve()
    return None


def relocate(service: dict, environment: dict[str, str], root: Path) -> dict[str, str]:
    """The environment with each path inside a volume of the service moved to where it is here: a bind mount's
    source, or for a named volume a folder of `root` (the container's volume, played by a local folder)."""
    return dict(zip(environment, relocate_all(service, list(environment.values()), root), strict=True))


def relocate_all(service: dict, texts: list[str], root: Path) -> list[str]:
    """`relocate` for a command line."""
    out = list(texts)
    for volume in service.get("volumes", []):
        source, mounted, *_ = volume.split(":")
        if source.startswith((".", "/")):
            here = (ROOT / source).resolve()
        else:
            here = root / source
            here.mkdir(parents=True, exist_ok=True)
        out = [str(here) + v[len(mounted) :] if v == mounted or v.startswith(mounted + "/") else v for v in out]
    return out


class Loopback:
    """Every (service, port) of compose.yaml mapped to 127.0.0.1:<free port>, and settings rewritten to match."""

    def __init__(self, services: dict[str, dict]) -> None:
        self.services = services
        self.addresses = {(n, p): f"127.0.0.1:{free_port()}" for n, s in services.items() for p in listen_ports(n, s)}

    def place(self, service: str, port: int, address: str) -> None:
        """Put a service's port somewhere already chosen (the embedded nats-server picks its own)."""
        self.addresses[(service, port)] = address

    def rewrite(self, own: str, text: str) -> str:
        """`node:9001` -> its loopback address; so is `0.0.0.0:9001` (or 127.0.0.1) in the node's own."""

        def local(m: re.Match) -> str:
            host, port = m.group(1), int(m.group(2))
            service = own if host in LOOPBACK else host
            if service not in self.services:
                return m.group(0)
            return self.addresses[(service, port)]

        return ADDRESS.sub(local, text)

    def environment(self, name: str) -> dict[str, str]:
        """The service's settings with every address rewritten, and a port of its own given alone (the metrics'
        `SCALER_METRICS_PORT: 9464`) moved to its loopback port too: two tests' nodes never share one."""
        out = {}
        for k, v in self.services[name].get("environment", {}).items():
            text = self.rewrite(name, str(v))
            if k.endswith("_PORT") and text.isdigit() and (own := self.addresses.get((name, int(text)))):
                text = own.rsplit(":", 1)[1]
            out[k] = text
        return out

    def command(self, name: str, command: list[str]) -> list[str]:
        return [self.rewrite(name, str(a)) for a in command]
