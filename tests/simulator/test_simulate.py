"""`scaler simulate`: both modes, the scoring they share, and how they report bad input."""

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench.policies import COLUMNS
from scaler.cli import main
from scaler.controller.core.policy import POLICIES, get_policy
from scaler.platform_stub.server import PlatformStub, SlotRecord
from scaler.proto import serverless_sim_pb2 as pb
from scaler.runtime.clock import Clock
from scaler.simulator import live
from scaler.simulator.dataset import load_dataset
from scaler.simulator.offline import simulate
from scaler.simulator.score import Failure

SMOKE = Path(__file__).parents[1] / "fixtures" / "function_smoke_test"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"

STATS_FIELDS = {
    "totalRequestsCount",
    "failedRequestsCount",
    "failuresByCause",
    "successRate",
    "invocationLatencyInSecs",
    "invocationExecutionTimeInSecs",
    "invocationExecutionTimeInGBs",
    "invocationScheduleTimeInSecs",
    "invocationIdleTimeInSecs",
    "totalSlotTimeInGBs",
    "totalLiveSlotCount",
    "coldStarts",
    "resourceUsageScore",
    "coldStartScore",
    "score",
    "coldStartRate",
    "wastedMemoryTimeInGBs",
    "waitP50InMs",
    "waitP99InMs",
    "waitMaxInMs",
}


def write_dataset(folder: Path, metas: list[dict], requests: list[dict | str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metas").write_text("".join(json.dumps(m) + "\n" for m in metas))
    lines = (r if isinstance(r, str) else json.dumps(r) for r in requests)
    (folder / "requests").write_text("".join(line + "\n" for line in lines))
    return folder


def meta(key: str, memory: int = 128, init: int = 50) -> dict:
    return {"key": key, "runtime": "python", "memoryInMb": memory, "timeoutInSecs": 60, "initDurationInMs": init}


def request(t: int, key: str, duration: int = 100, status: int = 200) -> dict:
    return {"startTime": 1_700_000_000_000 + t, "metaKey": key, "durationsInMs": duration, "statusCode": status}


def gentle(folder: Path) -> Path:
    """A trace whose every event is seconds apart, so scaler latency cannot change any decision.

    With the demo policy (5-minute keep-alive): a1 cold, a2 cold (a1 still busy), a3 reuses, b1
    cold and fails (its instance is destroyed), b2 cold again, a4 cold after both a's expired.
    """
    return write_dataset(
        folder,
        [meta("a", memory=1024, init=500), meta("b", memory=2048, init=2000)],
        [
            request(0, "a", duration=3000),
            request(1000, "a", duration=1000),
            request(10_000, "a"),
            request(20_000, "b", status=500),
            request(40_000, "b"),
            request(400_000, "a"),
        ],
    )


def simulate_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit:
        main(["simulate", *map(str, args)])
    out, err = capsys.readouterr()
    return exit.value.code, out, err


# Bad input: one line naming the file and line, exit status 1.


def test_a_missing_folder_is_named(tmp_path, capsys):
    code, out, err = simulate_cli(capsys, tmp_path / "nope", "--offline")
    assert code == 1
    why = "not a dataset folder (expected `metas` and `requests` inside)"
    assert err == f"scaler simulate: error: {tmp_path / 'nope'}: {why}\n"
    assert out == ""


@pytest.mark.parametrize("missing", ["metas", "requests"])
def test_a_missing_file_is_named(tmp_path, capsys, missing):
    folder = write_dataset(tmp_path / "d", [meta("a")], [request(0, "a")])
    (folder / missing).unlink()
    code, _, err = simulate_cli(capsys, folder, "--offline")
    assert code == 1
    assert f"{folder / missing}: cannot read: No such file or directory" in err


@pytest.mark.parametrize(
    ("file", "bad", "line", "why"),
    [
        ("requests", {**request(1, "a"), "durationsInMs": "x"}, 2, "Expected `int`, got `str` - at `$.durationsInMs`"),
        ("requests", request(2, "ghost"), 3, "metaKey 'ghost' has no entry in"),
        ("requests", "{not json", 4, "JSON is malformed"),
        ("requests", {**request(3, "a"), "durationsInMs": -1}, 2, "durationsInMs is negative"),
        ("metas", {"key": "b", "initDurationInMs": 1}, 2, "Object missing required field `memoryInMb`"),
        ("metas", {**meta("b"), "memoryInMb": 0}, 3, "memoryInMb must be positive"),
    ],
)
def test_a_bad_line_is_named_with_file_and_line(tmp_path, capsys, file, bad, line, why):
    good = {"metas": meta("a"), "requests": request(0, "a")}
    lines = {name: [entry] * (line - 1 if name == file else 1) for name, entry in good.items()}
    lines[file].append(bad)
    folder = write_dataset(tmp_path / "d", lines["metas"], lines["requests"])
    code, _, err = simulate_cli(capsys, folder, "--offline")
    assert code == 1
    assert err.startswith(f"scaler simulate: error: {folder / file}:{line}: ")
    assert why in err
    assert err.count("\n") == 1


def test_an_empty_trace_is_bad_input(tmp_path, capsys):
    folder = write_dataset(tmp_path / "d", [meta("a")], [])
    code, _, err = simulate_cli(capsys, folder, "--offline")
    assert (code, err) == (1, f"scaler simulate: error: {folder / 'requests'}: no requests\n")


@pytest.mark.parametrize("mode", [["--offline"], []])
def test_an_unknown_policy_is_refused_in_both_modes(capsys, mode):
    code, _, err = simulate_cli(capsys, SMOKE, "--policy", "clairvoyant", *mode)
    assert code == 2  # as argparse refuses any bad argument, in every subcommand
    assert "argument --policy: unknown policy 'clairvoyant'; choose one of demo, " in err


def test_an_unreachable_gateway_is_said_plainly(capsys, monkeypatch):
    monkeypatch.setattr(live, "GATEWAY_WAIT_S", 0.5)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = simulate_cli(capsys, SMOKE, "--gateway", f"127.0.0.1:{port}", "--platform-listen", "127.0.0.1:0")
    assert code == 1
    why = "(waited 0.5s); is `scaler up` running?"
    assert err == f"scaler simulate: error: no scaler gateway answers at 127.0.0.1:{port} {why}\n"
    assert out == ""


def test_a_platform_port_in_use_is_refused(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = f"127.0.0.1:{s.getsockname()[1]}"
        code, _, err = simulate_cli(capsys, SMOKE, "--platform-listen", taken)
    assert code == 1
    assert err == f"scaler simulate: error: cannot serve the Platform API on {taken}: Address already in use\n"


# Live mode's accounting, on a run whose timings we set.


async def test_live_counts_platform_work_in_trace_time_and_the_scaler_unscaled(tmp_path):
    dataset = load_dataset(write_dataset(tmp_path / "d", [meta("a", 1024, 500)], [request(0, "a", 150)] * 2))
    stub = PlatformStub("127.0.0.1:0", dataset.metas, 100, Clock(10))
    driver = live.LiveRun(dataset, None, stub, Clock(10))
    slot = SlotRecord("s1", 1024, created_ms=1010, request_id="a-1", created_done_ms=1125, key="a", instance_id="a-1")
    slot.init_started_ms, slot.ready_ms = 1130, 1650  # Init took 520 of clock time; 500 asked for
    slot.init_done = asyncio.get_running_loop().create_future()
    slot.init_done.set_result(pb.InitReply(status=pb.Ok, init_duration_in_ms=500))
    stub.accounting.slots["s1"] = slot
    first, second = driver.calls
    first.assign_start, first.assign_end, first.idle_start, first.idle_end = 1000, 1700, 1860, 1880
    second.assign_start, second.assign_end, second.idle_start, second.idle_end = 1800, 1900, 2055, 2065
    first.instance_id = second.instance_id = "a-1"
    one, two = driver.result(end_ms=3010).invocations
    # 700 ms window: CreateSlot 100 + Init 500 nominal, the other 100 were the scaler's: 100 / 10.
    assert one.schedule_ms == pytest.approx(600 + 10)
    assert one.cold and one.idle_ms == pytest.approx(2)
    # 100 ms window: the first request's execution (1700 + 150) covers 50, the scaler 50 / 10.
    assert two.schedule_ms == pytest.approx(50 + 5)
    assert not two.cold
    assert driver.result(end_ms=3010).slot_gb_s == pytest.approx(2.0)


# Offline mode.


def test_offline_prints_and_writes_the_challenges_statistics(tmp_path, capsys):
    out_json = tmp_path / "stats.json"
    code, out, err = simulate_cli(capsys, SMOKE, "--offline", "--speed", "5", "--json", out_json)
    assert code == 0
    assert err == (
        "note: --speed is ignored: offline mode runs no scaler and no clock\n"
        f"scaler simulate: the statistics written to {out_json}\n"
    )
    stats = json.loads(out_json.read_text())
    assert set(stats) == STATS_FIELDS | {"functions"}
    assert stats["totalRequestsCount"] == 980
    assert stats["failedRequestsCount"] == 0
    assert stats["score"] == pytest.approx(stats["resourceUsageScore"] + stats["coldStartScore"])
    assert 0 < len(stats["functions"]) <= 10
    lost = [f["lostScore"] for f in stats["functions"]]
    assert lost == sorted(lost, reverse=True)
    for name in STATS_FIELDS - {"failuresByCause"}:
        assert f"\n  {name} " in out
    assert stats["failuresByCause"] == dict.fromkeys(Failure, 0)
    for cause in Failure:  # under failedRequestsCount, indented
        assert f"\n    {cause} " in out
    assert "schedule time:" in out
    assert stats["functions"][0]["key"] in out


def test_smoke_execution_figures_match_the_challenges():
    stats = simulate(load_dataset(SMOKE), get_policy("demo")).stats()
    assert round(stats.invocation_execution_time_in_secs) == 349
    assert round(stats.invocation_execution_time_in_g_bs) == 155


def test_offline_is_deterministic():
    dataset = load_dataset(SMOKE)
    first, second = (simulate(dataset, get_policy("demo")) for _ in range(2))
    assert first == second
    assert first.stats().cold_starts > 0


def test_offline_counts_what_the_gentle_trace_implies(tmp_path):
    stats = simulate(load_dataset(gentle(tmp_path / "g")), get_policy("demo")).stats()
    assert stats.cold_starts == stats.total_live_slot_count == 5
    assert stats.invocation_schedule_time_in_secs == pytest.approx((3 * 600 + 2 * 2100) / 1000)
    assert stats.invocation_execution_time_in_g_bs == pytest.approx(4.2 + 0.4)
    # Slots, GB x s from CreateSlot: a1 0 -> 310.1 (5 min after its last use at 10.1), a2 1 -> 302.6,
    # b1 20 -> 22.2 (destroyed after its failed request), b2 40 -> 342.2, a4's 400 -> 420.7 (the end
    # of the run: its Idle at 400.7, and 20 s more).
    assert stats.total_slot_time_in_g_bs == pytest.approx(310.1 + 301.6 + 2 * 2.2 + 2 * 302.2 + 20.7)


@pytest.mark.skipif(not (SHARED / "dataSet_1").is_dir(), reason=f"the shared datasets are not at {SHARED}")
def test_offline_runs_the_five_hour_trace(tmp_path, capsys):
    # The demo policy's decisions over dataSet_1's five hours, as the offline mode is deterministic:
    # 68 of 22,868 requests start an instance (each waits CreateSlot + Init) and each slot serves first the
    # request it was started for, as the Go starter's (need_destroy retires some),
    # and nodes1, called every 30 s, keeps its one instance all along.
    out_json = tmp_path / "stats.json"
    code, out, _ = simulate_cli(capsys, SHARED / "dataSet_1", "--offline", "--policy", "demo", "--json", out_json)
    assert code == 0
    assert out.startswith("dataSet_1: offline, policy demo, 22868 requests")
    stats = json.loads(out_json.read_text())
    decided = {"totalRequestsCount": 22868, "failedRequestsCount": 0, "coldStarts": 68, "totalLiveSlotCount": 68}
    assert {k: stats[k] for k in decided} == decided
    assert stats["invocationScheduleTimeInSecs"] == pytest.approx(8.952)
    assert stats["totalSlotTimeInGBs"] == pytest.approx(18268.30525)  # slots charged until 20 s after the last Idle
    assert stats["score"] == pytest.approx(49.84063442773277)
    nodes1 = next(f for f in stats["functions"] if f["key"] == "nodes1")
    assert (nodes1["requests"], nodes1["coldStarts"]) == (634, 1)


def test_the_policy_bench_prints_a_row_per_policy_and_the_bound():
    bench = Path(__file__).resolve().parents[2] / "bench" / "policies.py"
    args = ["--datasets-dir", str(SMOKE.parent), "--traces", SMOKE.name, "gen-oneoff", "--seeds", "0", "1"]
    result = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    table, summary, papers = result.stdout.split("\n\n", 2)
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    score = COLUMNS.index("score")
    assert [(r[0].strip("| "), r[1]) for r in rows] == [
        (trace, policy)
        for trace in (SMOKE.name, "gen-oneoff/0", "gen-oneoff/1")
        for policy in (*POLICIES, "clairvoyant bound")
    ]
    assert {r[2] for r in rows} == {"100.00"}  # success %
    assert rows[len(POLICIES)][score] == "57.42"  # the bound of the smoke test
    # The summary: a row per trace and one for the shape's mean over its seeds, the bound beside each.
    lines = summary.splitlines()
    assert [line.split(" | ")[0].strip("| ") for line in lines[2:]] == [
        SMOKE.name,
        "gen-oneoff/0",
        "gen-oneoff/1",
        "gen-oneoff mean of 2",
    ]
    assert lines[2].split(" | ")[len(POLICIES) + 1] == "57.42"
    # Then each policy against fixed10 in the papers' terms, on each trace and the shape's mean.
    heading, against = papers.split("\n\n")
    assert heading == "Against fixed10, in the papers' terms: cold-start rate change / wasted memory time change"
    learned = next(line for line in against.splitlines() if line.startswith("| learned against fixed10 |"))
    smoke, mean = learned.strip("| \n").split(" | ")[1:]
    assert re.fullmatch(r"[+-]\d+ % / [+-]\d+ %", smoke) and re.fullmatch(r"[+-]\d+ % / [+-]\d+ %", mean)
    assert "fixed10 against fixed10" not in against


def test_the_decision_bench_times_learned_forecast_arithmetic_apart():
    """`bench/decide.py --arithmetic` finds the forecast functions the policies call wherever they import them: a
    learned that stopped calling them through its module would show no arithmetic at all."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "decide.py"
    args = ["--datasets-dir", str(SMOKE.parent), "--datasets", SMOKE.name, "--arithmetic"]
    result = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    def number(cell: str) -> float:
        return float(cell.split()[0].replace(",", ""))

    decisions, apart = result.stdout.split("\n\n")
    rows = [cells(line) for line in apart.splitlines()[2:]]
    by = {(r[1], r[2]): r for r in rows}
    assert number(by["demo", "all"][3]) == 0  # demo plans without a forecast
    assert number(by["learned", "own_points"][3]) > 0
    assert number(by["learned", "keep_plan"][3]) > 0
    calls = sum(number(r[3]) for r in rows if r[1] == "learned" and r[2] != "all")
    assert number(by["learned", "all"][3]) == calls
    learned = next(cells(row) for row in decisions.splitlines() if row.startswith(f"| {SMOKE.name} | learned | all |"))
    without = number(learned[9]) - number(by["learned", "all"][4])  # the run's CPU less the arithmetic's
    assert number(by["learned", "all"][6]) == pytest.approx(without, abs=0.11)  # each figure rounded


def test_the_decision_bench_idles_before_each_decision_when_asked():
    """`bench/decide.py --idle-ms` idles before every command's decision (a live run's pace): its run's wall time
    holds that idle for each decision, and the decisions are the same as back to back. A wait below 0 is refused."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "decide.py"
    args = ["--datasets-dir", str(SMOKE.parent), "--datasets", SMOKE.name, "--policies", "demo", "--requests", "30"]

    def run(*more: str) -> list[str]:
        result = subprocess.run([sys.executable, str(bench), *args, *more], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        row = next(line for line in result.stdout.splitlines() if "| demo | all |" in line)
        return [c.strip() for c in row.strip().strip("|").split("|")]

    apart, together = run("--idle-ms", "20"), run()
    decisions = int(apart[3].replace(",", ""))
    assert decisions == int(together[3].replace(",", "")) and decisions >= 30
    assert float(apart[10]) >= decisions * 0.020 - 0.05  # wall s, rounded to 0.1
    assert apart[11] == together[11]  # the same score: idling changes no decision
    bad = subprocess.run([sys.executable, str(bench), "--idle-ms", "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "argument --idle-ms: must be at least 0, got -1" in bad.stderr.splitlines()[-1]
