"""The features fold, pinned per version: what lets a snapshot keep its features across a tidy-up.

A snapshot is stamped with `features.VERSION` rather than the fold's source (scaler/controller/snapshots.py),
so a change to what the fold computes must come with a new version. These tests fold a reference
event log (tests/fixtures/features, written by its make.py) and compare with the features recorded
for the current version.
"""

import json
from pathlib import Path

import msgspec

from scaler.controller.core import features, folds
from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState
from scaler.proto.events import Batch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "features"


def folded() -> dict[str, tuple[FnState, FnStats]]:
    """Each function of the reference log: its state and its features."""
    fns: dict[str, tuple[FnState, FnStats]] = {}
    for line in (FIXTURES / "events.jsonl").read_bytes().splitlines():
        batch = msgspec.json.decode(line, type=Batch)
        s, f = fns.get(batch.key) or (FnState(key=batch.key), features.NO_STATS)
        fns[batch.key] = folds.replay(s, f, batch.events)
    return fns


def test_the_features_fold_computes_what_its_version_pins():
    pinned = json.loads((FIXTURES / f"stats-v{features.VERSION}.json").read_text())
    folded_now = {key: json.loads(msgspec.json.encode(f)) for key, (_, f) in sorted(folded().items())}
    assert folded_now == pinned, (
        f"the features fold no longer computes what version {features.VERSION} did: bump features.VERSION "
        "(snapshots of the old one are then not used) and run tests/fixtures/features/make.py"
    )


def test_the_reference_log_reaches_every_feature():
    stats = [f for _, f in folded().values()]
    for name in features.FnStats.__struct_fields__:
        assert any(getattr(st, name) for st in stats), f"no function of the reference log has {name}"
    assert any(len(st.gaps) == features.GAPS_KEPT for st in stats), "a ring of gaps that wrapped around"
    assert any(st.idle_oob for st in stats), "an idle time beyond the histogram's hours"


def test_the_lifecycle_never_reads_the_features(monkeypatch):
    """So a snapshot's lifecycle stands whatever the features fold does, and only the features are versioned."""
    real = folded()
    monkeypatch.setattr(features, "fold", lambda st, e, before, after: st)
    blind = folded()
    assert {k: s for k, (s, _) in real.items()} == {k: s for k, (s, _) in blind.items()}
    assert all(f is features.NO_STATS for _, f in blind.values())
    assert any(f != features.NO_STATS for _, f in real.values())
