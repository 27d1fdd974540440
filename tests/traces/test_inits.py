"""`--init-from`: init times where a trace has none, drawn per function from a distribution the user names,
seeded, and said by the import."""

import random
import re
import statistics

import pytest

from scaler.simulator.dataset import load_dataset
from scaler.traces import inits
from scaler.traces.build import Fill, Function, convert
from tests.traces.test_traces import APP, F1, azure2019, azure2021, trace_cli, write_csv


def converted(spec: str, n: int = 400, memory_mb: int | None = None, seed: int = 0) -> list[int]:
    """The inits of n functions of one request each, drawn as `--init-from spec` draws them."""
    functions = [Function(f"f{k}", 1, lambda rng: [(0, 10)], memory_mb=memory_mb) for k in range(n)]
    metas = convert(functions, 0, seed, Fill(256, inits.load(inits.named(spec)))).metas
    return [m.init_duration_in_ms for m in metas]


def test_a_constant_is_every_functions_init_and_500_ms_is_the_default(tmp_path, capsys):
    code, said, _ = trace_cli(capsys, "azure2019", azure2019(tmp_path / "az19"), tmp_path / "out")
    assert code == 0
    assert "  init 500 ms for every function (--init-from 500), an assumption: no trace gives one\n" in said
    assert {m.init_duration_in_ms for m in load_dataset(tmp_path / "out").metas.values()} == {500}
    assert set(converted("42", n=5)) == {42}


def test_loguniform_spreads_the_inits_over_its_range():
    drawn = converted("loguniform:50-5000")
    assert min(drawn) >= 50 and max(drawn) <= 5000
    assert len(set(drawn)) > 300  # a spread, not a handful of values
    assert 0.4 < sum(d < 500 for d in drawn) / len(drawn) < 0.6  # log-uniform: half below the geometric mean
    assert 0.15 < sum(d < 158 for d in drawn) / len(drawn) < 0.35  # a quarter in each quarter of the log range


def test_huawei2025_draws_the_papers_lognormal_of_all_regions_cold_starts():
    """EuroSys'25 Figure 10b: a LogNormal with mean 3.24 s and standard deviation 7.10 s, read as the
    distribution's own: its median is then 1.35 s, within the regions' medians of 0.1-2 s the paper gives."""
    fit = inits.named("huawei2025")
    rng = random.Random(1)
    draws = [fit.draw(rng, None)[0] for _ in range(40_000)]
    assert 1250 < statistics.median(draws) < 1450
    assert 3000 < statistics.fmean(draws) < 3500
    assert 0.05 < sum(d < 200 for d in draws) / len(draws) < 0.10  # tens of milliseconds ...
    assert 0.03 < sum(d > 10_000 for d in draws) / len(draws) < 0.08  # ... to seconds: the spread at issue
    assert statistics.median(converted("huawei2025")) == pytest.approx(1345, rel=0.2)


def test_the_import_says_where_the_inits_came_from_and_their_spread(tmp_path, capsys):
    code, said, _ = trace_cli(
        capsys, "azure2021", azure2021(tmp_path / "a21"), tmp_path / "out", "--init-from", "huawei2025"
    )
    assert code == 0
    line = next(line for line in said.splitlines() if line.startswith("  init "))
    assert (
        "from Huawei 2025's cold starts, all regions (LogNormal, mean 3.24 s, sd 7.10 s; EuroSys'25, Figure 10b)"
        in line
    )
    low, high = sorted(m.init_duration_in_ms for m in load_dataset(tmp_path / "out").metas.values())
    spread = re.search(r"; 2 functions, ([\d.]+) (ms|s) to ([\d.]+) (ms|s), median [\d.]+ (ms|s)$", line)
    assert spread, line
    assert [
        float(spread[1]) * (1000 if spread[2] == "s" else 1),
        float(spread[3]) * (1000 if spread[4] == "s" else 1),
    ] == [
        pytest.approx(low, abs=5),
        pytest.approx(high, abs=5),
    ]


def test_inits_are_seeded_per_function_and_stay_with_it_across_windows(tmp_path, capsys):
    src = azure2019(tmp_path / "az19")

    def inits_of(name: str, *args) -> dict[str, int]:
        assert trace_cli(capsys, "azure2019", src, tmp_path / name, "--init-from", "loguniform:10-10000", *args)[0] == 0
        return {k: m.init_duration_in_ms for k, m in load_dataset(tmp_path / name).metas.items()}

    whole, again, other = inits_of("a"), inits_of("b"), inits_of("c", "--seed", 1)
    assert whole == again and whole != other
    first_minute = inits_of("w", "--window", "0-1")  # F1 alone: its init is the one it had in the whole day
    assert first_minute == {k: v for k, v in whole.items() if k in first_minute} and len(first_minute) == 1


def cold_start_table(path, starts: list[tuple[float, str]]):
    header = ["day", "time", "clusterName", "funcName", "userID", "requestID", "totalCost_cold_start"]
    header += ["podAllocationCost", "deployCodeCost", "deployDependencyCost", "schedulingCost", "podID"]
    rows = [[0, 1.0, 1, 10, 134, "82f1aa19", s, 0.02, 0.04, 0.4, 1.7, f"{pool}-0000577863"] for s, pool in starts]
    return write_csv(path, header, rows)


def test_a_cold_start_table_gives_each_function_a_start_of_a_pod_of_its_memory(tmp_path):
    table = cold_start_table(
        tmp_path / "R2" / "day_00.csv",
        [(0.1, "pool22-300-128"), (0.11, "pool22-300-128"), (1.0, "pool23-400-256"), (9.0, "pool26-1000-1024")],
    )
    cold_start_table(tmp_path / "R2" / "day_01.csv", [(1.2, "pool23-400-256")])  # a region's folder: every day
    spec = f"huawei2025:{table.parent}"
    assert set(converted(spec, n=50, memory_mb=128)) == {100, 110}
    assert set(converted(spec, n=50, memory_mb=200)) == {1000, 1200}  # the smallest pool it fits in: 256 MB
    assert set(converted(spec, n=50, memory_mb=300)) == {9000}
    assert set(converted(spec, n=50, memory_mb=4096)) == {9000}  # larger than any pool: the largest
    functions = [Function(f"f{k}", 1, lambda rng: [(0, 10)]) for k in range(60)]  # no memory in the trace
    metas = convert(functions, 0, 0, Fill(256, inits.load(inits.named(spec)))).metas
    pairs = {(m.init_duration_in_ms, m.memory_in_mb) for m in metas}
    assert pairs == {(100, 128), (110, 128), (1000, 256), (1200, 256), (9000, 1024)}  # a start with its pod's memory
    assert "5 cold starts (Huawei 2025, median 1.00 s), among the pods of the function's memory" in str(
        inits.load(inits.named(spec))
    )


@pytest.mark.parametrize("spec", ["fast", "0", "-5", "500ms", "loguniform:10", "loguniform:500-50", "huawei2024", ""])
def test_a_malformed_spec_is_refused_in_one_line(spec, tmp_path, capsys):
    code, _, err = trace_cli(capsys, "azure2021", azure2021(tmp_path), tmp_path / "out", "--init-from", spec)
    assert code == 2 and not (tmp_path / "out").exists()
    said = err.strip().splitlines()[-1]
    assert said.startswith(f"scaler trace import: error: argument --init-from: not an init distribution: {spec!r}")
    assert "loguniform:LO-HI" in said and "Traceback" not in err


def test_a_cold_start_table_that_is_not_there_is_named(tmp_path, capsys):
    code, _, err = trace_cli(
        capsys, "azure2021", azure2021(tmp_path), tmp_path / "out", "--init-from", "huawei2025:R9.csv"
    )
    assert code == 1 and err.strip() == "scaler trace import: error: R9.csv: cannot read: No such file or directory"
    bad = cold_start_table(tmp_path / "R1.csv", [(0.1, "pool22-300-128")])
    bad.write_text(bad.read_text().replace("0.1,", "fast,"))
    code, _, err = trace_cli(capsys, "azure2021", tmp_path, tmp_path / "out", "--init-from", f"huawei2025:{bad}")
    assert code == 1 and "R1.csv:2: totalCost_cold_start is not a number: 'fast'" in err


def test_a_function_keeps_its_trace_memory_when_the_table_draws_its_init(tmp_path, capsys):
    table = cold_start_table(tmp_path / "R1.csv", [(0.3, "pool22-300-128"), (2.5, "pool24-600-512")])
    out = tmp_path / "out"
    assert (
        trace_cli(capsys, "azure2019", azure2019(tmp_path / "az19"), out, "--init-from", f"huawei2025:{table}")[0] == 0
    )
    metas = load_dataset(out).metas
    f1 = metas[f"{APP[:16]}-{F1[:16]}"]
    assert (f1.memory_in_mb, f1.init_duration_in_ms) == (256, 2500)  # its app's 130-190 MB: the 512 MB pool's start
