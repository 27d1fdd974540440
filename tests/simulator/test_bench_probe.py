"""bench/live.py's probe: a live call's time split at the scaler's handler, the simulator's stamps and the scaler's."""

import json

import pytest

from bench import live as bench
from scaler.simulator.dataset import load_dataset
from tests.simulator.test_simulate import meta, request, write_dataset

pytestmark = pytest.mark.live_trace


async def test_a_probed_run_stamps_every_call_between_its_sending_and_its_answer(tmp_path):
    """The reference's handlers (stamped in its process by bench/probe) and the simulator (stamped in this one) on
    one clock: every call entered its handler after it was sent, and left it before its answer came back."""
    trace = write_dataset(tmp_path / "trace", [meta("a"), meta("b")], [request(t, k) for t, k in enumerate("abab")])
    dataset, probe = load_dataset(trace), tmp_path / "probe"
    probe.mkdir()

    run, _ = await bench.live(dataset, "in-memory reference", probe)

    assert not run.stats().failed_requests_count
    sent = json.loads((probe / bench.SENT).read_text())
    handled = [json.loads(f.read_text()).get("handled", {}) for f in probe.glob("*.json")]
    for method in ("Assign", "Idle"):
        entered = {rid: (at, ms) for h in handled for at, ms, rid in h.get(method, ())}
        assert sorted(rid for _, _, rid in sent[method]) == sorted(entered), method
        for began, answered, rid in sent[method]:
            at, ms = entered[rid]
            assert began < at and at + ms / 1000 < answered, (method, rid)
    rows = bench.probe_rows("tiny", probe)[-1]
    assert [row.split(" | ")[1:3] for row in rows] == [["Assign", "4"], ["Idle", "4"]]


def test_a_call_is_split_at_its_handler():
    """Sent at 1 s and answered at 1.010 s, in its handler from 1.002 s for 5 ms: 2 ms there, 5 in it, 3 back; a
    call the scaler never saw (refused on its way) is left out."""
    sent = {"Assign": [(1.0, 1.010, "r1"), (2.0, 2.001, "lost")], "Idle": []}
    handled = {"Assign": {"r1": (1.002, 5.0)}, "Idle": {}}

    (row,) = bench.call_rows("run", handled, sent)

    assert row == "| run | Assign | 1 | 2.00 / 2.00 / 2.0 | 5.00 / 5.00 / 5.0 | 3.00 / 3.00 / 3.0 |"
