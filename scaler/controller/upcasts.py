"""Snapshots of older state versions, brought to the current one: an upgrade keeps every snapshot.

A snapshot's body is decoded as plain data (maps, lists, strings, numbers), each step below turns
version N's data into N+1's, and the result is converted to today's structs. Since version 11 a
snapshot's features are a body of their own (scaler/controller/snapshots.py): a change to the features
bumps `features.VERSION`, never `state.VERSION`, and needs no step here. A change to what
`scaler/controller/core/state.py` stores or computes bumps `state.VERSION` and adds its step here;
`tests/controller/test_upgrade.py` pins the shape per version and loads a store written by every release.
"""

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from scaler.controller.core import state

Data = dict[str, Any]
T = TypeVar("T")


def _v1(snapshot: Data) -> Data:
    """Version 1 remembered a release's instance without its time: the snapshot's own time stands for it (a
    release is kept a little longer than its window, never shorter)."""
    at = snapshot.get("at_ms", 0)
    for fn in snapshot.get("states", {}).values():
        fn["finished"] = {r: [instance, at] for r, instance in fn.get("finished", {}).items()}
    return snapshot


def _v2(snapshot: Data) -> Data:
    """Version 2 had no sessions: its functions have none bound, its instances serve none, and none is
    restarting; those fields' defaults say so, so the data stands as it is."""
    return snapshot


def _v3(snapshot: Data) -> Data:
    """Version 3's stats had no queueing times or quiet bins (what the cidre and spes policies learn from):
    they start empty, as a new function's do."""
    return snapshot


def _v4(snapshot: Data) -> Data:
    """Version 4 kept a function's releases in one map, oldest first: version 5's generations of them, in order."""
    n = 128  # version 5's FINISHED_GENERATION
    for fn in snapshot.get("states", {}).values():
        releases = list(fn.get("finished", {}).items())
        fn["finished"] = [dict(releases[i : i + n]) for i in range(0, len(releases), n)]
    return snapshot


def _v5(snapshot: Data) -> Data:
    """Version 5's stats had no leaders (the functions a function follows): they start empty, as a new
    function's do."""
    return snapshot


def _v6(snapshot: Data) -> Data:
    """Version 6 had no tenants, states, versions, tombstones, live limits or per-function policy (their defaults
    say none); its instances had no runtime (the function's, when it had one: they were started with it), no
    version, no counts (they start at 0), and `restarting` where version 7 says why it retires when released. A
    function deleted under version 6 left nothing behind, so it has no tombstone: its next Assign serves it."""
    for fn in snapshot.get("states", {}).values():
        runtime = (fn.get("meta") or {}).get("runtime", "")
        for inst in fn.get("instances", {}).values():
            if inst.pop("restarting", False):
                inst["retire_on_release"] = "restarted"
            inst.setdefault("runtime", runtime)
    return snapshot


def _v7(snapshot: Data) -> Data:
    """Version 7 held no function's starts (StartsHeld): the field's default says none is held."""
    return snapshot


def _v8(snapshot: Data) -> Data:
    """Version 8's stats had no next gap's points (`next_gap`): it starts empty, and is built from the gaps at the
    function's next call; until then the learned policy builds it from them when it asks."""
    return snapshot


def _v9(snapshot: Data) -> Data:
    """Version 9 had no ClockRebased: its times are on the clock of the node that wrote them, as they were."""
    return snapshot


def _v10(snapshot: Data) -> Data:
    """Version 10 kept each function's features (`stats`) inside its state; version 11 keeps them beside the states,
    by function, in a body of their own: the split. A function that had learned nothing yet has none."""
    features = snapshot.setdefault("features", {})
    for key, fn in snapshot.get("states", {}).items():
        if (stats := fn.pop("stats", None)) is not None:
            features[key] = stats
    return snapshot


def _v11(snapshot: Data) -> Data:
    """Version 11's limits set by an operator had no exchange rate: the default says the file's, or the node's."""
    return snapshot


def _v12(snapshot: Data) -> Data:
    """Version 12 closed no slot time for an instance wanted at time 0, which only an offline run's clock has (a
    node's is the epoch's): nothing a node stored is changed."""
    return snapshot


# from version N to N+1
STEPS: dict[int, Callable[[Data], Data]] = {
    1: _v1,
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
    9: _v9,
    10: _v10,
    11: _v11,
    12: _v12,
}

# Features versions whose stats today's features fold carries on from. A version that only adds histories
# (3: `queued`, `quiet_bins`; 4: `returned_ms`, `leaders`, `cues`) leaves what the earlier one folded right, the
# new histories starting empty; so does one that only adds what the others are worked out into (5: `next_gap`,
# from `gaps`, `lulls` and `gap_hist`, built again where missing); so does 6's (`starts`, `late`, `overheads`:
# the system a function runs on, measured from its events); so does one whose successor only drops what the others
# are worked out into (7's `next_gap`, built when a policy asks since 8: a snapshot's is ignored); so do 8 and 9,
# whose folds are 10's but for 9's slot time (summed from the lifecycle's since 10: a snapshot's is ignored); one
# that folds a stat differently is not listed, and its snapshots are ignored (the stream replayed in full).
FEATURES_CONTINUED = frozenset({2, 3, 4, 5, 7, 8, 9})


def upcast(body: bytes, version: int, into: type[T]) -> T:
    """Decode a snapshot written at `version` (older than today's) into today's `into`."""
    data = msgspec.msgpack.decode(body)
    for v in range(version, state.VERSION):
        data = STEPS[v](data)
    return msgspec.convert(data, into)
