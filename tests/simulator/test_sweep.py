"""`scaler sweep`: knobs set and refused, points simulated in worker processes, kept in SQLite, drawn."""

import json
import sqlite3

import msgspec
import pytest

from scaler.cli import main
from scaler.controller.core.policy import POLICIES, get_policy
from scaler.controller.core.policy.base import knobs
from scaler.controller.core.policy.spes import SpesConfig
from scaler.controller.knobs import KnobError, listing, with_knobs
from scaler.simulator.sweep import Point, Reach, compared, front, points, reach
from tests.simulator.test_run_metrics import by_hand_trace

SPES_KNOBS = ", ".join(sorted(k.name for k in knobs(SpesConfig)))


def test_a_knob_is_a_field_of_the_policy_set_from_text():
    policy, values = with_knobs(get_policy("fixed10"), {"keep_alive_ms": "7min"})
    assert policy.config.keep_alive_ms == 420_000 and values == {"keep_alive_ms": 420_000}
    assert policy.name == "fixed10" and get_policy("fixed10").config.keep_alive_ms == 600_000
    assert with_knobs(get_policy("learned"), {"wait_gb": "2.5"})[0].config.wait_gb == 2.5
    assert with_knobs(get_policy("learned"), {"exchange_rate": "10"})[0].config.exchange_rate == 10.0  # None: learned


@pytest.mark.parametrize(
    "policy, settings, message",
    [
        ("spes", {"keep_alive_ms": "1"}, f"policy spes has no knob 'keep_alive_ms' (its knobs: {SPES_KNOBS})"),
        ("demo", {"name": "x"}, "policy demo has no knob 'name' (its knobs: keep_alive_ms)"),
        ("demo", {"keep_alive_ms": "soon"}, "demo.keep_alive_ms=soon: not a number (a number of ms, or with a unit"),
        ("demo", {"keep_alive_ms": "-5"}, "demo.keep_alive_ms=-5: must be 0 or more"),
        ("learned", {"min_samples": "2.5"}, "learned.min_samples=2.5: must be a whole number"),
        ("learned", {"wait_gb": "-1"}, "learned.wait_gb=-1: must be 0 or more"),
    ],
)
def test_unknown_knobs_and_bad_values_are_refused(policy, settings, message):
    with pytest.raises(KnobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        with_knobs(get_policy(policy), settings)


def test_points_are_every_combination_of_each_policys_knobs():
    got = points(["demo", "learned"], ["keep_alive_ms=1min,5min", "learned.wait_gb=1,2", "learned.min_samples=3,6"])
    assert [p.label for p in got] == [
        "demo keep_alive_ms=1min",
        "demo keep_alive_ms=5min",
        "learned wait_gb=1 min_samples=3",
        "learned wait_gb=1 min_samples=6",
        "learned wait_gb=2 min_samples=3",
        "learned wait_gb=2 min_samples=6",
    ]
    assert points(["spes"], []) == [Point("spes")]  # nothing varied: its defaults
    assert [p.label for p in points(["demo"], ["keep_alive_ms=1min,60s,60000,2min"])] == [
        "demo keep_alive_ms=1min",
        "demo keep_alive_ms=2min",
    ]  # one value, however written, is one point
    with pytest.raises(
        KnobError, match=rf"no policy swept has a knob 'keep_alive' .*demo: keep_alive_ms; spes: {SPES_KNOBS}"
    ):
        points(["demo", "spes"], ["keep_alive=1"])
    with pytest.raises(KnobError, match="'cidre' is not one of the policies swept"):
        points(["demo"], ["cidre.keep_alive_ms=1"])
    with pytest.raises(KnobError, match="expected KNOB=A,B,C"):
        points(["demo"], ["keep_alive_ms"])


def test_compare_adds_every_policy_at_its_defaults_a_swept_one_too_unless_swept_at_them():
    swept = points(["learned", "demo"], ["learned.exchange_rate=1,10"])  # demo: at its defaults, no knob varied
    added = compared(swept)
    assert [p.policy for p in added] == [p for p in POLICIES if p != "demo"]  # demo is swept at its defaults
    assert all(p.compared and not p.settings for p in added)


def test_the_pareto_front_is_what_nothing_beats_on_both():
    assert front([(0.5, 10), (0.25, 20), (0.5, 30), (0.25, 20), (0.6, 5)]) == [True, True, False, True, True]


def test_a_curve_reaches_a_point_when_one_of_its_points_is_as_good_on_both_else_it_says_where_it_falls_short():
    curve = [(0.05, 100.0), (0.02, 400.0), (0.01, 900.0)]
    assert reach(curve, (0.03, 500.0)) == Reach(1)  # (0.02, 400) is better on both
    assert reach(curve, (0.01, 2_000.0)) == Reach(2)  # as few cold starts, less memory
    assert reach(curve, (0.005, 5_000.0)) == Reach(None, "its fewest cold starts are 1.00% of the invocations")
    assert reach(curve, (0.02, 300.0)) == Reach(None, "at 2.00% cold starts or fewer it wastes 400 GB·s or more")


def test_a_sweep_runs_its_points_in_processes_keeps_them_and_draws_them(tmp_path, capsys):
    trace, db, page = by_hand_trace(tmp_path / "by-hand"), tmp_path / "runs.sqlite", tmp_path / "sweep.html"
    args = ["sweep", trace, "--policy", "demo", "--policy", "fixed10", "--vary", "keep_alive_ms=1min,7min"]
    with pytest.raises(SystemExit) as exit:
        main([*map(str, args), "--jobs", "2", "--db", str(db), "--page", str(page)])
    out, err = capsys.readouterr()
    assert exit.value.code == 0, err
    assert "sweep: 4 points of by-hand, 2 at once" in err and "sweep: 4/4 points" in err
    db = sqlite3.connect(db)
    rows = db.execute("SELECT policy, knobs, cold_start_rate, sweep FROM runs ORDER BY id").fetchall()
    # A minute's keep-alive loses the instance over the 394 s gap (2 of 4 wait), seven minutes keep it (1 of 4).
    assert [(p, json.loads(k), rate) for p, k, rate, _ in rows] == [
        ("demo", {"keep_alive_ms": 60_000}, 0.5),
        ("demo", {"keep_alive_ms": 420_000}, 0.25),
        ("fixed10", {"keep_alive_ms": 60_000}, 0.5),
        ("fixed10", {"keep_alive_ms": 420_000}, 0.25),
    ]
    assert len({s for *_, s in rows}) == 1 and rows[0][3].startswith("by-hand ")
    assert db.execute("SELECT COUNT(*) FROM functions").fetchone() == (4,)
    lines = out.splitlines()
    assert [line.endswith("*") for line in lines[1:5]] == [True] * 4  # each trades one for the other
    assert "4 points in " in out
    # each policy's curve against the other's points: the same keep-alive, the same point
    assert "demo reaches fixed10 keep_alive_ms=7min (25.00% and 420 GB·s) at demo keep_alive_ms=7min" in out
    html = page.read_text()
    assert "Pareto front" in html and "keep_alive_ms=7 min" in html
    assert "Where demo&#x27;s curve reaches the other points" in html


def test_a_sweep_refuses_an_unknown_knob_before_it_starts(tmp_path, capsys):
    trace = by_hand_trace(tmp_path / "by-hand")
    with pytest.raises(SystemExit) as exit:
        main(["sweep", str(trace), "--policy", "spes", "--vary", "keep_alive_ms=1", "--db", str(tmp_path / "x")])
    assert exit.value.code == 1
    assert f"scaler sweep: error: no policy swept has a knob 'keep_alive_ms' (their knobs: spes: {SPES_KNOBS})" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "x").exists()


def test_knobs_are_listed_with_their_defaults_and_descriptions(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["sweep", "--knobs", "--policy", "fixed10", "--policy", "learned"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert "fixed10:\n  keep_alive_ms  600000  how long an idle instance stays, ms" in out
    assert "exchange_rate" in out and "None: learned from the run" in out and "spes" not in out
    with pytest.raises(SystemExit) as exit:
        main(["sweep", "--policy", "demo"])  # nothing to sweep
    assert exit.value.code == 1
    assert "a DATASET_DIR to sweep (or --knobs)" in capsys.readouterr().err


def test_a_knob_set_makes_a_new_policy_and_leaves_the_shipped_one():
    shipped = get_policy("spes")
    tuned, values = with_knobs(shipped, {"dense_bins": "7"})
    assert (tuned.config.dense_bins, values, tuned.name) == (7, {"dense_bins": 7}, "spes")
    assert shipped.config.dense_bins == 5 and msgspec.structs.replace(tuned.config, dense_bins=5) == shipped.config
    assert "dense_bins" in listing(shipped) and "idle runs mostly shorter than this" in listing(shipped)
