"""EVENTS's configuration: its subjects and storage, how much of it is kept, and making it so.

Whichever component starts first creates the stream (a node, or a worker with the default
retention); a node brings an existing one to its own retention once every partition's snapshot
holds what the dropped batches did (scaler/controller/snapshotter.py).
"""

import argparse
from dataclasses import dataclass, replace

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from scaler.proto.subjects import EVENTS, EVT
from scaler.runtime import service
from scaler.runtime.bus import answered

# The log. Its oldest batches go once they pass the retention's age or size (discard old): what
# they did lives on in the snapshots (scaler/controller/snapshots.py), which the controller keeps ahead of
# what the stream drops (scaler/controller/rebuild.py says when a partition cannot be rebuilt).
STREAM = StreamConfig(
    name=EVENTS,
    subjects=[f"{EVT}.>"],
    retention=RetentionPolicy.LIMITS,
    storage=StorageType.FILE,
    discard=DiscardPolicy.OLD,
    max_msgs=-1,  # no limit but `Retention`'s: a count would drop a busy function's batches no snapshot holds yet
    max_msgs_per_subject=-1,
)


@dataclass(frozen=True)
class Retention:
    """How much of EVENTS is kept: batches older than `max_age_s`, or past `max_bytes` of batches, go first."""

    max_age_s: float = 24 * 3600.0
    max_bytes: int = 10 * 10**9


DEFAULT_RETENTION = Retention()

# The least retention a node accepts: the controller looks at the stream every second and, once the stream
# holds half its byte limit, snapshots a partition whose snapshot falls into the older half of what is kept
# (or, always, one older than a quarter of the age), so half the store must outlast a second of the busiest
# appends (about 1,000 batches/s of ~1.5 kB).
MIN_RETENTION_HOURS = 1 / 60
MIN_STORE_LIMIT_GB = 0.004


def add_retention(p: argparse.ArgumentParser) -> None:
    """How much of EVENTS is kept: set by whichever component creates the stream (a node or a worker)."""
    p.add_argument(
        "--retention-hours",
        type=service.at_least(MIN_RETENTION_HOURS),
        default=service.env("RETENTION_HOURS", str(DEFAULT_RETENTION.max_age_s / 3600)),
        metavar="H",
        help="EVENTS keeps batches this long (docs/operations.md: Retention); a node sets it on the stream once every"
        " partition has a snapshot [SCALER_RETENTION_HOURS]",
    )
    p.add_argument(
        "--store-limit-gb",
        type=service.at_least(MIN_STORE_LIMIT_GB),
        default=service.env("STORE_LIMIT_GB", str(DEFAULT_RETENTION.max_bytes / 10**9)),
        metavar="GB",
        help="... and at most this much of them, the oldest going first [SCALER_STORE_LIMIT_GB]",
    )


def retention(a: argparse.Namespace) -> Retention:
    return Retention(max_age_s=a.retention_hours * 3600, max_bytes=int(a.store_limit_gb * 10**9))


async def ensure_stream(
    js: JetStreamContext,
    replicas: int = 1,
    retention: Retention | None = None,
    patience_s: float = 30.0,
    atomic: bool = False,
) -> StreamConfig:
    """Create the stream, or bring an existing one to this configuration; the configuration it has then.
    Safe to run from every component.

    An existing stream keeps its replicas when they are more than asked for: an operator (or a
    node started with `--replicas 3`) raised them, and a component started without the flag must
    not put them back. A new stream gets `retention` (the default one from those not told it:
    workers); an existing one keeps its own here, and a node brings it to its own later
    (`set_retention`). A cluster's JetStream answers nothing until it has elected its leader: that
    is waited for, up to `patience_s`. `atomic` allows atomic batch publishes (nats-server 2.12+: a
    node appends several functions' batches as one); once allowed, it stays.
    """
    return await answered(lambda: _ensure_stream(js, replicas, retention, atomic), patience_s)


INSUFFICIENT_STORAGE = 10047  # JetStream's error code: the server cannot reserve a stream's max_bytes


class StoreTooSmall(RuntimeError):
    """The event stream's size limit is more than the nats-server's JetStream store can reserve."""


async def _ensure_stream(
    js: JetStreamContext, replicas: int, retention: Retention | None, atomic: bool
) -> StreamConfig:
    try:
        info = await js.stream_info(EVENTS)
    except NotFoundError:
        retention = retention or DEFAULT_RETENTION
        try:
            return (await js.add_stream(_config(replicas, retention, atomic))).config
        except APIError as e:
            if e.err_code != INSUFFICIENT_STORAGE:
                raise
            raise StoreTooSmall(
                f"nats-server cannot reserve the {retention.max_bytes / 10**9:g} GB store limit of {EVENTS}"
                f" ({e.description}): set one its JetStream store can hold with --store-limit-gb"
                " (SCALER_STORE_LIMIT_GB), or give nats-server a larger store"
            ) from None
    have = info.config
    wanted = _config(max(replicas, have.num_replicas or 1), retention_of(have), atomic or bool(have.allow_atomic))
    if _differs(have, wanted):
        return (await js.update_stream(wanted)).config
    return have


async def set_retention(js: JetStreamContext, retention: Retention) -> bool:
    """Bring the existing stream's limits to `retention`; whether they changed. Lowered limits drop the
    oldest batches at once: a node does it only once every partition's snapshot holds what they did."""
    have = (await js.stream_info(EVENTS)).config
    if not limits_off(have, retention):
        return False
    wanted = _config(have.num_replicas or 1, retention, bool(have.allow_atomic))
    await js.update_stream(replace(wanted, subjects=have.subjects))
    return True


def retention_of(config: StreamConfig) -> Retention:
    return Retention(max_age_s=config.max_age or 0.0, max_bytes=config.max_bytes or -1)


def limits_off(have: StreamConfig, retention: Retention) -> str:
    """How the stream's limits differ from `retention` and no other limit ("" when they do not): one line."""
    off = []
    if (age := have.max_age or 0.0) != retention.max_age_s:
        off.append(f"max_age {age:g} s, not {retention.max_age_s:g}")
    if (size := have.max_bytes or -1) != retention.max_bytes:
        off.append(f"max_bytes {size:,}, not {retention.max_bytes:,}")
    off += [f"{name} {n:,}" for name in ("max_msgs", "max_msgs_per_subject") if (n := getattr(have, name) or -1) > 0]
    return "; ".join(off)


def _config(replicas: int, retention: Retention, atomic: bool = False) -> StreamConfig:
    config = replace(STREAM, num_replicas=replicas, max_age=retention.max_age_s, max_bytes=retention.max_bytes)
    return replace(config, allow_atomic=True) if atomic else config  # unset: a server before 2.12 refuses it


def _differs(have: StreamConfig, want: StreamConfig) -> bool:
    same = all(getattr(have, f) == getattr(want, f) for f in ("subjects", "retention", "discard", "num_replicas"))
    return not same or bool(have.allow_atomic) != bool(want.allow_atomic)
