"""Runs kept in SQLite: `scaler simulate --save-run FILE.sqlite`, read back by `--compare` and by SQL."""

import json
import sqlite3

import pytest

from tests.simulator.test_run_metrics import START_MS, by_hand_trace
from tests.simulator.test_simulate import simulate_cli


@pytest.fixture
def by_hand(tmp_path):
    return by_hand_trace(tmp_path / "by-hand")


def test_a_saved_run_is_a_row_of_runs_and_one_per_function(by_hand, tmp_path, capsys):
    store, stats_json = tmp_path / "runs.sqlite", tmp_path / "stats.json"
    dataset = by_hand
    code, _, err = simulate_cli(
        capsys, dataset, "--offline", "--policy", "demo", "--save-run", store, "--json", stats_json
    )
    assert code == 0 and "kept as run 1 in" in err
    stats = json.loads(stats_json.read_text())
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    [run] = db.execute("SELECT * FROM runs").fetchall()
    assert (run["trace"], run["policy"], run["mode"], json.loads(run["knobs"])) == ("by-hand", "demo", "offline", {})
    assert run["code"]  # the commit (or the version, outside a checkout)
    assert run["cold_start_rate"] == 0.5 == stats["coldStartRate"]
    assert run["score"] == stats["score"]
    assert run["wasted_memory_time_in_g_bs"] == stats["wastedMemoryTimeInGBs"]
    assert run["wait_p99_in_ms"] == START_MS
    assert json.loads(run["failures_by_cause"]) == stats["failuresByCause"]
    [f] = db.execute("SELECT * FROM functions WHERE run = ?", (run["id"],)).fetchall()
    assert (f["key"], f["requests"], f["cold_starts"], f["cold_start_rate"]) == ("f", 4, 2, 0.5)
    assert f["wasted_g_bs"] == f["slot_g_bs"] - f["execution_g_bs"]


def test_compare_reads_a_run_back_from_the_store(by_hand, tmp_path, capsys):
    store, page = tmp_path / "runs.sqlite", tmp_path / "page.html"
    dataset = by_hand
    for policy in ("demo", "fixed10"):
        assert simulate_cli(capsys, dataset, "--offline", "--policy", policy, "--save-run", store)[0] == 0
    code, _, _ = simulate_cli(capsys, dataset, "--offline", "--report", page, "--compare", f"{store}:1")
    assert code == 0
    assert "by-hand: offline, policy demo" in page.read_text()  # run 1, not the newest (fixed10)
    code, _, err = simulate_cli(capsys, dataset, "--offline", "--report", page, "--compare", f"{store}:9")
    assert code == 1 and "no run 9" in err
