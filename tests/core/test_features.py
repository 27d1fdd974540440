"""The features fold, pinned per version: what lets a snapshot keep its features across a tidy-up.

A snapshot is stamped with `features.VERSION` rather than the fold's source (scaler/controller/snapshots.py),
so a change to what the fold computes must come with a new version. These tests fold a reference
event log (tests/fixtures/features, written by its make.py) and compare with the features recorded
for the current version.
"""

import json
from pathlib import Path

import msgspec

from scaler.controller.core import features, state
from scaler.controller.core.state import FnState, replay
from scaler.proto.events import Batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "features"


def folded() -> dict[str, FnState]:
    states: dict[str, FnState] = {}
    for line in (FIXTURES / "events.jsonl").read_bytes().splitlines():
        batch = msgspec.json.decode(line, type=Batch)
        states[batch.key] = replay(states.get(batch.key) or FnState(key=batch.key), batch.events)
    return states


def test_the_features_fold_computes_what_its_version_pins():
    pinned = json.loads((FIXTURES / f"stats-v{features.VERSION}.json").read_text())
    folded_now = {key: json.loads(msgspec.json.encode(s.stats)) for key, s in sorted(folded().items())}
    assert folded_now == pinned, (
        f"the features fold no longer computes what version {features.VERSION} did: bump features.VERSION "
        "(snapshots of the old one are then not used) and run tests/fixtures/features/make.py"
    )


def test_the_reference_log_reaches_every_feature():
    stats = [s.stats for s in folded().values()]
    for name in features.FnStats.__struct_fields__:
        assert any(getattr(st, name) for st in stats), f"no function of the reference log has {name}"
    assert any(len(st.gaps) == features.GAPS_KEPT for st in stats), "a ring of gaps that wrapped around"
    assert any(st.idle_oob for st in stats), "an idle time beyond the histogram's hours"


def test_the_lifecycle_never_reads_the_features(monkeypatch):
    """So a snapshot's lifecycle stands whatever the features fold does, and only the features are versioned."""
    real = folded()
    monkeypatch.setattr(state, "observe", lambda st, e, before, after: st)
    blind = folded()
    assert {k: msgspec.structs.replace(s, stats=features.NO_STATS) for k, s in real.items()} == blind
