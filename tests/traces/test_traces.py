"""`scaler trace import`: the field's public formats, on small files shaped as published (column names
exactly as the traces' own descriptions give them), converted to datasets the simulator reads."""

import csv
import random
from collections import Counter
from pathlib import Path

import pytest

from scaler.cli import main
from scaler.simulator.dataset import load_dataset
from scaler.traces.build import Function, Percentiles, sample
from tests.simulator.test_simulate import simulate_cli

OWNER, APP, APP2 = "o" * 64, "a1" * 32, "b2" * 32
F1, F2, F3 = "f1" * 32, "f2" * 32, "f3" * 32
DAY_MS = 1_563_148_800_000  # azure2019's day 1


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def trace_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit:
        main(["trace", "import", *map(str, args)])
    out, err = capsys.readouterr()
    return exit.value.code, out, err


# --- Azure Functions 2019 -----------------------------------------------------------------------


def azure2019(folder: Path) -> Path:
    """F1: 3 calls in minute 1, 2 in minute 3; F2 (another app, no memory row): 1 in minute 2; F3: no durations."""
    minutes = [str(m) for m in range(1, 1441)]
    counts = {F1: {1: 3, 3: 2}, F2: {2: 1}, F3: {1: 4}}
    write_csv(
        folder / "invocations_per_function_md.anon.d01.csv",
        ["HashOwner", "HashApp", "HashFunction", "Trigger", *minutes],
        [
            [OWNER, APP if f != F2 else APP2, f, "http", *(c.get(m, 0) for m in range(1, 1441))]
            for f, c in counts.items()
        ],
    )
    percentiles = [f"percentile_Average_{q}" for q in (0, 1, 25, 50, 75, 99, 100)]
    write_csv(
        folder / "function_durations_percentiles.anon.d01.csv",
        ["HashOwner", "HashApp", "HashFunction", "Average", "Count", "Minimum", "Maximum", *percentiles],
        [
            [OWNER, APP, F1, 150, 5, 100, 400, 100, 110, 120, 150, 200, 390, 400],
            [OWNER, APP2, F2, 2000, 1, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000, 2000],
        ],
    )
    memory = [f"AverageAllocatedMb_pct{q}" for q in (1, 5, 25, 50, 75, 95, 99, 100)]
    write_csv(
        folder / "app_memory_percentiles.anon.d01.csv",
        ["HashOwner", "HashApp", "SampleCount", "AverageAllocatedMb", *memory],
        [[OWNER, APP, 100, 150, 130, 131, 140, 150, 160, 170, 180, 190]],
    )
    return folder


def test_azure2019_minutes_become_arrivals_durations_and_memory_are_drawn(tmp_path, capsys):
    out = tmp_path / "out"
    code, said, _ = trace_cli(capsys, "azure2019", azure2019(tmp_path / "az19"), out, "--seed", 3, "--init-ms", 700)
    assert code == 0, said
    assert "1 functions without duration percentiles left out" in said
    d = load_dataset(out)
    f1, f2 = f"{APP[:16]}-{F1[:16]}", f"{APP2[:16]}-{F2[:16]}"
    assert set(d.metas) == {f1, f2}
    minute = Counter((r.meta_key, (r.start_time - DAY_MS) // 60_000) for r in d.requests)
    assert minute == {(f1, 0): 3, (f1, 2): 2, (f2, 1): 1}  # column "1" is the day's first minute
    assert all(100 <= r.durations_in_ms <= 400 for r in d.requests if r.meta_key == f1)
    assert [r.durations_in_ms for r in d.requests if r.meta_key == f2] == [2000]
    assert d.metas[f1].memory_in_mb == 256  # drawn within the app's 130-190 MB, rounded up to 128 MB steps
    assert d.metas[f2].memory_in_mb == 256  # its app has no memory row: --memory-mb's default
    assert {m.init_duration_in_ms for m in d.metas.values()} == {700}
    assert d.metas[f1].timeout_in_secs == 300


def test_the_same_seed_gives_the_same_dataset_another_seed_another(tmp_path, capsys):
    src = azure2019(tmp_path / "az19")
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert trace_cli(capsys, "azure2019", src, tmp_path / name, "--seed", seed)[0] == 0
    requests = {name: (tmp_path / name / "requests").read_bytes() for name in "abc"}
    assert requests["a"] == requests["b"]
    assert requests["a"] != requests["c"]


def test_percentiles_are_drawn_between_the_known_points():
    p = Percentiles(((0, 10.0), (50, 20.0), (100, 100.0)))
    rng = random.Random(0)
    draws = [p.draw(rng) for _ in range(2000)]
    assert min(draws) >= 10 and max(draws) <= 100
    assert 0.45 < sum(d <= 20 for d in draws) / len(draws) < 0.55  # half of them below the median


def test_a_sample_spans_the_popularity_of_the_trace():
    functions = [Function(f"f{n}", n, lambda rng: []) for n in range(1, 101)]
    for seed in range(5):
        picked = sample(functions, 4, seed)
        assert [f.invocations > 25 * k for k, f in enumerate(picked)] == [True] * 4  # one from each quarter
        assert all(f.invocations <= 25 * (k + 1) for k, f in enumerate(picked))
    assert sample(functions, 4, 0) == sample(functions, 4, 0)
    assert len(sample(functions, 500, 0)) == 100


# --- Azure Functions 2021 -----------------------------------------------------------------------


def azure2021(folder: Path) -> Path:
    rows = [[APP, F1, 5160.142570018768, 0.134], [APP2, F2, 5161.280997037888, 0.013], [APP, F1, 5241.567, 42.356]]
    write_csv(
        folder / "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt",
        ["app", "func", "end_timestamp", "duration"],
        rows,
    )
    return folder


def test_azure2021_each_row_is_a_request_starting_at_its_end_less_its_duration(tmp_path, capsys):
    src = azure2021(tmp_path) / "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt"
    out = tmp_path / "out"
    code, said, _ = trace_cli(capsys, "azure2021", tmp_path, out, "--memory-mb", 512)
    assert code == 0, said
    d = load_dataset(out)
    base = 1_612_051_200_000
    assert [(r.start_time - base, r.meta_key[:5], r.durations_in_ms) for r in d.requests] == [
        (5_160_009, APP[:5], 134),
        (5_161_268, APP2[:5], 13),
        (5_199_211, APP[:5], 42_356),
    ]
    assert {m.memory_in_mb for m in d.metas.values()} == {512}
    code, _, _ = trace_cli(capsys, "azure2021", src, tmp_path / "w", "--window", "86.6-90")  # 5196 s on
    assert code == 0 and len(load_dataset(tmp_path / "w").requests) == 1


# --- Huawei Cloud 2023 and the 2025 cold starts --------------------------------------------------


def huawei_private(folder: Path) -> Path:
    """Functions 0 and 7 on day 0: function 0 called twice in second 1 and once in second 61."""
    times = [(0, s) for s in (0, 1, 61)]
    write_csv(
        folder / "requests_second" / "day_000.csv",
        ["day", "time", "0", "7"],
        [[0, 0, "", 1.0], [0, 1, 2.0, ""], [0, 61, 1.0, ""]],
    )
    write_csv(
        folder / "function_delay_second" / "day_000.csv",
        ["day", "time", "0", "7"],
        [[d, t, {1: 30.5, 61: 80.0}.get(t, ""), 12.0 if t == 0 else ""] for d, t in times],
    )
    write_csv(
        folder / "memory_limit_minute" / "day_000.csv",
        ["day", "time", "0", "7"],
        [[0, 0, 1024, 300], [0, 60, 512, 300]],
    )
    write_csv(folder / "instances_minute" / "day_000.csv", ["day", "time", "0", "7"], [[0, 0, 2, 1], [0, 60, 1, 1]])
    return folder


def test_huawei_seconds_become_arrivals_with_that_seconds_execution_time(tmp_path, capsys):
    out = tmp_path / "out"
    code, said, _ = trace_cli(capsys, "huawei", huawei_private(tmp_path / "private_dataset"), out)
    assert code == 0, said
    assert "requests_second, function_delay_second, memory_limit_minute / instances_minute" in said
    d = load_dataset(out)
    base = 1_672_531_200_000
    seconds = [((r.start_time - base) // 1000, r.meta_key, r.durations_in_ms) for r in d.requests]
    assert sorted(seconds) == [(0, "7", 12), (1, "0", 30), (1, "0", 30), (61, "0", 80)]
    assert (d.metas["0"].memory_in_mb, d.metas["7"].memory_in_mb) == (512, 300)  # 1024 MB over 2 pods, then 512


def test_huawei_2025_cold_starts_set_the_inits(tmp_path, capsys):
    header = ["day", "time", "clusterName", "funcName", "userID", "requestID", "totalCost_cold_start"]
    header += ["podAllocationCost", "deployCodeCost", "deployDependencyCost", "schedulingCost", "podID"]
    starts = write_csv(
        tmp_path / "R1.csv",
        header,
        [[0, 51937.425, 1, 10, 134, "82f1aa19", 2.239314, 0.027, 0.045, 0.454, 1.713, "pool24-600-512-0000577863"]],
    )
    public = write_csv(
        tmp_path / "public_dataset" / "requests_minute" / "day_00.csv", ["day", "time", "3"], [[0, 0, 5]]
    )
    out = tmp_path / "out"
    assert trace_cli(capsys, "huawei", public.parents[1], out, "--cold-starts", starts)[0] == 0
    d = load_dataset(out)
    assert (d.metas["3"].init_duration_in_ms, d.metas["3"].memory_in_mb) == (2239, 512)  # the pod's pool
    assert {r.durations_in_ms for r in d.requests} == {100}  # no execution times in the public set
    assert all(0 <= r.start_time - d.start_ms < 60_000 for r in d.requests) and len(d.requests) == 5


# --- Every format, end to end ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt, make", [("azure2019", azure2019), ("azure2021", azure2021), ("huawei", huawei_private)])
def test_a_converted_sample_simulates_with_the_papers_metrics(fmt, make, tmp_path, capsys):
    assert trace_cli(capsys, fmt, make(tmp_path / "src"), tmp_path / "out", "--sample", 1)[0] == 0
    assert len(load_dataset(tmp_path / "out").metas) == 1
    code, out, _ = simulate_cli(capsys, tmp_path / "out", "--offline", "--policy", "fixed10")
    assert code == 0
    assert "\n  coldStartRate " in out and "\n  wastedMemoryTimeInGBs " in out and "\n  waitP99InMs " in out


def test_a_column_missing_is_named_with_its_file(tmp_path, capsys):
    write_csv(tmp_path / "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt", ["app", "func", "end"], [[1, 2, 3]])
    code, _, err = trace_cli(capsys, "azure2021", tmp_path, tmp_path / "out")
    assert code == 1
    assert "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt: no column 'end_timestamp'" in err
    assert not (tmp_path / "out").exists()


def test_a_day_not_in_the_folder_is_refused(tmp_path, capsys):
    code, _, err = trace_cli(capsys, "azure2019", azure2019(tmp_path / "az19"), tmp_path / "out", "--day", 9)
    assert code == 1 and "no invocations_per_function_md.anon.d09.csv (days present: 1)" in err
