"""Which node runs what (`scaler nodes`; Pulsar's membership and getCurrentAssignments), from the lease buckets.

Each node's heartbeat says who it is (`About`: where its gRPC port is, since when it runs, its policy);
each partition's lease names its node and was last renewed when its entry was written. A node whose
heartbeat is gone but whose leases are not yet (killed a moment ago) shows with no heartbeat: the
other nodes take its partitions once those lapse.
"""

import time

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from scaler.controller.leases import LEASES, NODES
from scaler.runtime.kv import entries_at


class About(msgspec.Struct, frozen=True, kw_only=True):
    """What a node's heartbeat says of it."""

    address: str = ""  # its gRPC port, as callers reach it ("" for a controller without one)
    started_ms: int = 0
    policy: str = ""


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """A node as `scaler nodes` shows it."""

    node: str
    address: str = ""
    started_ms: int = 0
    policy: str = ""
    heartbeat_s: float | None = None  # seconds since its last heartbeat; None: it has none (gone)
    partitions: list[int] = []
    lease_ages_s: list[float] = []  # seconds since each partition's lease was renewed, in the order of `partitions`


async def members(js: JetStreamContext) -> list[Member]:
    """Every node with a heartbeat or a lease, by name."""
    beats, leases = await _listed(js, NODES), await _listed(js, LEASES)
    now = time.time()
    held: dict[str, list[tuple[int, float]]] = {}
    for key, (node, written) in leases.items():
        held.setdefault(node.decode(), []).append((int(key[1:]), now - written))
    out = []
    for node in sorted(beats.keys() | held.keys()):
        about = _about(beats[node][0]) if node in beats else About()
        mine = sorted(held.get(node, []))
        out.append(
            Member(
                node=node,
                address=about.address,
                started_ms=about.started_ms,
                policy=about.policy,
                heartbeat_s=round(now - beats[node][1], 3) if node in beats else None,
                partitions=[p for p, _ in mine],
                lease_ages_s=[round(max(0.0, age), 3) for _, age in mine],
            )
        )
    return out


def about(address: str, started_ms: int, policy: str) -> bytes:
    return msgspec.json.encode(About(address=address, started_ms=started_ms, policy=policy))


def _about(value: bytes) -> About:
    try:
        return msgspec.json.decode(value, type=About) if value else About()
    except msgspec.DecodeError:  # a node of a version whose heartbeat said nothing
        return About()


async def _listed(js: JetStreamContext, bucket: str) -> dict[str, tuple[bytes, float]]:
    try:
        return await entries_at(js, bucket)
    except NotFoundError:  # no node has started
        return {}
