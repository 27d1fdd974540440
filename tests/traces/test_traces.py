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
    code, said, _ = trace_cli(capsys, "azure2019", azure2019(tmp_path / "az19"), out, "--seed", 3, "--init-from", 700)
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


# --- vHive In-Vitro's samples of Azure 2019 -------------------------------------------------------


def invitro(folder: Path, minutes: list[str], counts: dict[str, dict[int, int]]) -> Path:
    """In-Vitro's layout today (data/traces/example, samples/N): invocations.csv with a Trigger and the
    minute columns given, durations.csv, and memory.csv per function (HashFunction), an app's memory
    shared among its functions. F1 and F2 of one app, memory 1000-1100 MB and 100-120 MB."""
    write_csv(
        folder / "invocations.csv",
        ["HashOwner", "HashApp", "HashFunction", "Trigger", *minutes],
        [
            [OWNER, APP, f, "queue", *(c.get(int(m.removeprefix("minute_")), 0) for m in minutes)]
            for f, c in counts.items()
        ],
    )
    write_csv(
        folder / "durations.csv",
        ["HashOwner", "HashApp", "HashFunction", "Average", "Count", "Minimum", "Maximum"]
        + [f"percentile_Average_{q}" for q in (0, 1, 25, 50, 75, 99, 100)],
        [[OWNER, APP, f, 100.0, 5.0, 99.0, 101.0, 99.0, 99.0, 99.0, 100.0, 101.0, 101.0, 101.0] for f in counts],
    )
    write_csv(
        folder / "memory.csv",
        ["HashOwner", "HashApp", "HashFunction", "SampleCount", "AverageAllocatedMb"]
        + [f"AverageAllocatedMb_pct{q}" for q in (1, 5, 25, 50, 75, 95, 99, 100)],
        [
            [OWNER, APP, F1, 10.0, 1050.0, 1000.0, 1010.0, 1020.0, 1050.0, 1060.0, 1080.0, 1090.0, 1100.0],
            [OWNER, APP, F2, 10.0, 110.0, 100.0, 101.0, 105.0, 110.0, 112.0, 115.0, 118.0, 120.0],
        ],
    )
    return folder


def minute_of_day(d) -> Counter:
    return Counter((r.meta_key[-16:], (r.start_time - DAY_MS) // 60_000) for r in d.requests)


def test_an_invitro_sample_converts_with_its_memory_per_function(tmp_path, capsys):
    src = invitro(tmp_path / "example", [str(m) for m in range(1, 1441)], {F1: {1: 2, 1440: 1}, F2: {7: 3}})
    code, said, err = trace_cli(capsys, "azure2019", src, tmp_path / "out")
    assert code == 0, err
    assert "read invocations.csv, durations.csv, memory.csv" in said
    d = load_dataset(tmp_path / "out")
    assert minute_of_day(d) == {(F1[:16], 0): 2, (F1[:16], 1439): 1, (F2[:16], 6): 3}
    memory = {k[-16:]: m.memory_in_mb for k, m in d.metas.items()}
    assert memory == {F1[:16]: 1152, F2[:16]: 128}  # each its own row, not the app's: 1000-1100 MB and 100-120 MB


def test_invitros_older_samples_are_n_inv_run_mem_with_minute_columns_and_no_trigger(tmp_path, capsys):
    """data/traces/N_inv.csv as In-Vitro shipped them: HashFunction, HashApp, HashOwner, minute_1..minute_1440;
    N_run.csv its durations; N_mem.csv per app. Several samples in one folder: SRC names one."""
    folder = tmp_path / "traces"
    minutes = [f"minute_{m}" for m in range(1, 1441)]
    for n, f in ((10, F1), (20, F2)):
        write_csv(
            folder / f"{n}_inv.csv",
            ["HashFunction", "HashApp", "HashOwner", *minutes],
            [[f, f, f, 0, 0, 4] + [0] * 1437],
        )
        write_csv(
            folder / f"{n}_run.csv",
            ["HashFunction", "HashApp", "HashOwner", "Count", "Average", "Minimum", "Maximum"]
            + [f"percentile_Average_{q}" for q in (0, 1, 25, 50, 75, 99, 100)],
            [[f, f, f, 6, 365, 53.0, 799.0, 265, 265, 265, 265, 466, 466, 466]],
        )
        write_csv(
            folder / f"{n}_mem.csv",
            ["HashApp", "HashOwner", "SampleCount", "AverageAllocatedMb"]
            + [f"AverageAllocatedMb_pct{q}" for q in (1, 5, 25, 50, 75, 95, 99, 100)],
            [[f, f, 133, 3 * n * 5] + [3 * n * 5] * 8],  # 150 MB, 300 MB
        )
    code, _, err = trace_cli(capsys, "azure2019", folder, tmp_path / "out")
    assert code == 1 and "holds 2 samples (10_inv.csv, 20_inv.csv): give one's invocations file as SRC" in err
    code, said, err = trace_cli(capsys, "azure2019", folder / "20_inv.csv", tmp_path / "out")
    assert code == 0, err
    assert "read 20_inv.csv, 20_run.csv, 20_mem.csv" in said
    d = load_dataset(tmp_path / "out")
    assert minute_of_day(d) == {(F2[:16], 2): 4}  # minute_3 is the day's third minute
    assert {r.durations_in_ms for r in d.requests} <= set(range(265, 467))
    assert [m.memory_in_mb for m in d.metas.values()] == [384]  # 20_mem.csv's 300 MB, not 10_mem.csv's 150


def test_a_samplers_excerpt_keeps_its_minutes_of_the_day(tmp_path, capsys):
    """In-Vitro's preprocessing keeps a window of minutes (its reference traces: 09:00 on, columns 541..):
    a column is the minute its name says, and --window counts from the start of that day."""
    src = invitro(tmp_path / "x", [str(m) for m in range(541, 546)], {F1: {541: 1, 545: 2}, F2: {543: 5}})
    assert trace_cli(capsys, "azure2019", src, tmp_path / "all")[0] == 0
    assert minute_of_day(load_dataset(tmp_path / "all")) == {(F1[:16], 540): 1, (F1[:16], 544): 2, (F2[:16], 542): 5}
    assert trace_cli(capsys, "azure2019", src, tmp_path / "w", "--window", "541-543")[0] == 0
    assert minute_of_day(load_dataset(tmp_path / "w")) == {(F2[:16], 542): 5}


def test_files_are_known_by_their_columns_not_their_names(tmp_path, capsys):
    src = invitro(tmp_path / "x", [str(m) for m in range(1, 61)], {F1: {1: 2}, F2: {7: 3}})
    for old, new in (("invocations", "a"), ("durations", "b"), ("memory", "c")):
        (src / f"{old}.csv").rename(src / f"{new}.csv")
    write_csv(src / "dag_structure.csv", ["Width", "WidthPercentile", "Depth"], [[1, "0.00%", 1]])  # not a trace file
    code, said, err = trace_cli(capsys, "azure2019", src, tmp_path / "out")
    assert code == 0, err
    assert "read a.csv, b.csv, c.csv" in said
    assert len(load_dataset(tmp_path / "out").requests) == 5


def test_the_other_azure_format_is_named_when_given_to_the_wrong_importer(tmp_path, capsys):
    a21 = azure2021(tmp_path / "a21")
    code, _, err = trace_cli(capsys, "azure2019", a21, tmp_path / "out")
    assert code == 1
    assert "no Azure 2019 invocations file" in err and "is an Azure 2021 trace: scaler trace import azure2021" in err
    src = invitro(tmp_path / "x", ["1", "2"], {F1: {1: 1}})
    code, _, err = trace_cli(capsys, "azure2021", src / "invocations.csv", tmp_path / "out")
    assert code == 1 and "an Azure 2019 invocations file: scaler trace import azure2019" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


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


def test_invitros_azure2021_examples_are_found_by_their_columns(tmp_path, capsys):
    """In-Vitro's data/traces/example/Azure2021/Azure2021_30.csv: the trace's columns under another name."""
    folder = tmp_path / "Azure2021"
    rows = [[APP, F1, "10.0000000000000", "9.000"], [APP, F2, "11.00000000000000", "9.000"], [APP2, F3, "132.3", "9.0"]]
    write_csv(folder / "Azure2021_30.csv", ["app", "func", "end_timestamp", "duration"], rows)
    code, said, err = trace_cli(capsys, "azure2021", folder, tmp_path / "out")
    assert code == 0, err
    assert "read Azure2021_30.csv" in said
    d = load_dataset(tmp_path / "out")
    assert [(r.start_time - 1_612_051_200_000, r.durations_in_ms) for r in d.requests] == [
        (1000, 9000),
        (2000, 9000),
        (123_300, 9000),
    ]
    write_csv(folder / "Azure2021_200.csv", ["app", "func", "end_timestamp", "duration"], rows)
    code, _, err = trace_cli(capsys, "azure2021", folder, tmp_path / "two")
    assert code == 1 and "2 files of the trace (Azure2021_200.csv, Azure2021_30.csv): give one as SRC" in err
    assert trace_cli(capsys, "azure2021", folder / "Azure2021_200.csv", tmp_path / "one")[0] == 0


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
    assert trace_cli(capsys, "huawei", public.parents[1], out, "--init-from", f"huawei2025:{starts}")[0] == 0
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
