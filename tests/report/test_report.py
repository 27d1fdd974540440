"""The pages of `scaler simulate --report` and `scaler replay --html`: self-contained, and holding the run.

What a browser shows is checked by scripts/render_check.py (headless Chromium); here, what the HTML
and the saved run hold.
"""

import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import plotly.offline
import pytest

from scaler import replay
from scaler.controller.snapshots import Snapshot
from scaler.proto.events import Assigned, Batch, Released
from scaler.proto.subjects import function_events, partition
from scaler.report import draw
from scaler.report.draw import PLOTLY_JS
from scaler.report.timeline import Life, Timeline
from scaler.runtime.bus import connected
from scaler.simulator import report
from scaler.store import stream
from tests.live_run import simulate_live
from tests.replay.test_replay import scaler_replay, traffic
from tests.simulator.test_simulate import SMOKE, gentle, simulate_cli
from tests.stack import Stack
from tests.store.test_retention import rounds, tiny_stack, truncated_stack


class Resources(HTMLParser):
    """What a page would fetch: script sources and linked resources."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []
        self.scripts = 0
        self.plots: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for name in ("src", "href", "data"):
            if a.get(name) and tag in ("script", "link", "img", "iframe", "object", "embed"):
                self.fetched.append(a[name])
        if tag == "div" and a.get("class") == "plot":
            self.plots.append(a["id"])


def parsed(page: str) -> Resources:
    r = Resources()
    r.feed(page)
    return r


def figures(page: str) -> list[dict]:
    """The Plotly figures' traces as the page holds them, for its loader to draw."""
    found = re.findall(r'<script type="application/json" id="fig\d+-data">(.*?)</script>', page, re.S)
    return [json.loads(f)["data"] for f in found]


def assert_self_contained(page: str, folder: Path | None = None) -> Resources:
    """It fetches nothing but plotly.js, from the file beside it (which `folder` holds, whole)."""
    r = parsed(page)
    assert r.fetched == [PLOTLY_JS], f"the page fetches {r.fetched}"
    assert plotly.offline.get_plotlyjs()[:2000] not in page  # not inlined
    if folder is not None:
        assert (folder / PLOTLY_JS).read_text() == plotly.offline.get_plotlyjs()
    assert r.plots and len(figures(page)) == len(r.plots), "a figure without its data, or none"
    return r


def test_an_offline_report_is_self_contained_and_holds_the_run(tmp_path, capsys):
    html, saved, stats = tmp_path / "run.html", tmp_path / "run.json", tmp_path / "stats.json"
    code, _, err = simulate_cli(
        capsys, SMOKE, "--offline", "--policy", "demo", "--report", html, "--save-run", saved, "--json", stats
    )
    assert code == 0, err
    assert err.splitlines() == [
        f"scaler simulate: the statistics written to {stats}",
        f"scaler simulate: the run (for --compare) written to {saved}",
        f"scaler simulate: the report written to {html}",
    ]
    page, run, printed = html.read_text(), report.load(saved.read_bytes()), json.loads(stats.read_text())
    r = assert_self_contained(page, tmp_path)
    # The score and its two halves, as the statistics say them.
    for name in ("score", "resourceUsageScore", "coldStartScore"):
        assert f"{printed[name]:.2f}" in page
    assert run.stats.score == printed["score"]
    # The functions that lost the most, each with its timeline and gaps drawn.
    worst = [f.key for f in run.functions[: report.DRAWN]]
    assert worst == [f["key"] for f in printed["functions"][: report.DRAWN]]
    for key in worst:
        assert f"{key}: instances and waits" in page and f"{key}: gaps against keep-alives" in page
    # Overview (2) + score + per function: lanes, timeline and gaps.
    assert len(r.plots) == 3 + 3 * len(worst)
    # What the timelines hold is what the run counted: one instance per slot, one busy spell per request.
    lives = [i for t in run.timelines for i in t.instances]
    assert len(lives) == run.stats.total_live_slot_count
    assert sum(len(i.busy) for i in lives) == run.stats.total_requests_count
    assert sum(w.cold for t in run.timelines for w in t.waits) == run.stats.cold_starts  # demo: one per miss
    # The worst function's cold starts are drawn where they happened, with the policy's reason.
    first = run.timeline(worst[0])
    started = "started for a waiting request (reason on hover)"
    drawn = next(fig for fig in figures(page) if any(t.get("name") == started for t in fig))
    cold = next(t for t in drawn if t["name"] == started)
    assert len(cold["x"]) == sum(i.cold for i in first.instances)
    assert "fixed keep-alive 300s" in page and all(i.reason in page for i in first.instances)


def test_a_report_compares_two_runs_on_the_same_functions(tmp_path, capsys):
    demo, histogram = tmp_path / "demo.json", tmp_path / "histogram.html"
    assert simulate_cli(capsys, SMOKE, "--offline", "--policy", "demo", "--save-run", demo)[0] == 0
    code, _, err = simulate_cli(
        capsys, SMOKE, "--offline", "--policy", "histogram", "--report", histogram, "--compare", demo
    )
    assert code == 0, err
    page, other = histogram.read_text(), report.load(demo.read_bytes())
    assert_self_contained(page)
    assert "function_smoke_test: offline, policy histogram vs function_smoke_test: offline, policy demo" in page
    assert f"{other.stats.score:.2f}" in page
    # Each function drawn twice, side by side: this run's timeline and the other's.
    assert page.count('<div class="side">') == 3 * report.DRAWN  # lanes, timeline, gaps: each side by side
    assert page.count("function_smoke_test: offline, policy demo: gaps") == 0  # titled by run, not by function
    assert "has no timeline of" not in page


def test_compare_needs_a_report_and_a_saved_run(tmp_path, capsys):
    code, _, err = simulate_cli(capsys, SMOKE, "--offline", "--compare", tmp_path / "x.json")
    assert code == 1 and "--compare puts another run beside this one in the --report page" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"score": 1}')
    code, _, err = simulate_cli(capsys, SMOKE, "--offline", "--report", tmp_path / "r.html", "--compare", bad)
    assert code == 1 and f"{bad}: not a run saved with --save-run" in err
    assert not (tmp_path / "r.html").exists()


async def test_replay_draws_one_functions_timeline_with_each_decision(nats_url, tmp_path):
    page_path = tmp_path / "fn.html"
    async with Stack(nats_url) as stack:
        await traffic(stack)
        async with connected(nats_url, "test") as nc:
            code = await replay.show(nc, "fn", None, None, out=io.StringIO(), html=page_path)
            t: Timeline = await replay.timeline(nc, "fn")
            early = await replay.timeline(nc, "fn", until_seq=1)
    assert code == 0
    page = page_path.read_text()
    assert_self_contained(page)
    # fn-1 served r1 then r2; fn-2 was cold-started for r3 and destroyed (need_destroy).
    assert [i.id for i in t.instances] == ["fn-1", "fn-2"]
    assert [r for _, _, r in t.instances[0].busy] == ["r1", "r2"] and t.instances[1].gone_ms
    assert {w.request_id for w in t.waits if w.cold} == {"r1", "r3"}
    assert all(step.text in page for step in t.steps)  # every decision in words
    assert all(i.reason and i.reason in page for i in t.instances)  # each start with the policy's reason
    assert "fn: replayed" in page
    assert len(early.steps) == 1 and len(early.instances) == 1 and not early.instances[0].ready_ms


async def test_replay_html_needs_one_function(tmp_path):
    code, _, err = await scaler_replay("--nats", "nats://127.0.0.1:1", "--html", str(tmp_path / "x.html"))
    assert code == 2 and "--html draws one function's timeline: give --key" in err


def test_a_saved_run_reads_back_as_written(tmp_path, capsys):
    saved = tmp_path / "run.json"
    assert simulate_cli(capsys, SMOKE, "--offline", "--policy", "demo", "--save-run", saved)[0] == 0
    run = report.load(saved.read_bytes())
    assert report.load(report.save(run)) == run
    assert Path(saved).stat().st_size < 2_000_000  # a small trace stays small


@pytest.mark.live_trace
async def test_a_live_report_reads_the_reasons_back_from_the_scalers_stream(tmp_path):
    folder, page_path, saved = gentle(tmp_path / "g"), tmp_path / "live.html", tmp_path / "live.json"
    # its events read on the NATS the scaler it drove says it uses
    await simulate_live(folder, tmp_path / "up", "demo", "--report", str(page_path), "--save-run", str(saved))
    run, page = report.load(saved.read_bytes()), page_path.read_text()
    assert_self_contained(page)
    assert {t.key for t in run.timelines} == {"a", "b"}  # both functions' events, read from the stream
    assert sum(len(t.instances) for t in run.timelines) == run.stats.total_live_slot_count
    assert all(life.reason == "cold start: no idle instance" for t in run.timelines for life in t.instances)
    assert "cold start: no idle instance" in page and "fixed keep-alive 300s" in page
    assert "times are the scaler&#x27;s clock" in page


def test_a_big_function_is_drawn_where_its_starts_were_densest():
    sparse = [Life(id=f"s{n}", wanted_ms=n * 10_000, for_request=f"r{n}", gone_ms=n * 10_000 + 5) for n in range(900)]
    burst_ms = 3_000_000
    burst = [Life(id=f"b{n}", wanted_ms=burst_ms + n * 100, for_request=f"q{n}") for n in range(draw.MAX_ROWS)]
    t = Timeline(key="big", instances=sparse + burst)
    w = draw.Window.of(t, end_ms=9_000_000)
    assert w.lo == burst_ms and w.hi == burst_ms + draw.MIN_WINDOW_MS  # the burst, over a minute at least
    assert {life.id for life in burst} <= {life.id for life in w.lives} and len(w.lives) < draw.MAX_ROWS + 10
    assert w.note.startswith(f"{len(w.lives):,} of {900 + draw.MAX_ROWS:,} instances, where starts were densest")
    alive = [Life(id=f"a{n}", wanted_ms=n * 4_000) for n in range(2 * draw.MAX_ROWS)]  # long-lived, started before
    w = draw.Window.of(Timeline(key="big", instances=alive + burst), end_ms=9_000_000)
    assert {life.id for life in burst} <= {life.id for life in w.lives} and len(w.lives) == 2 * draw.MAX_ROWS
    small = Timeline(key="small", instances=sparse[:10])
    assert draw.Window.of(small, end_ms=9_000_000).lives == sparse[:10]  # a small one whole


async def test_a_replay_from_a_snapshot_draws_the_instances_the_snapshot_held(nats_url):
    async with tiny_stack(nats_url) as stack:
        await truncated_stack(nats_url, stack)
        await rounds(stack, 2, ["fn7"], tag="late")  # fn7's instance serves two more, after the snapshot or not
        await stack.settled()
        async with connected(nats_url, "test") as nc:
            t, snap = await drawn_from_one_snapshot(nc, "fn7")
            since = await served_after(nc, "fn7", max(snap.seq, snap.last_seq.get("fn7", 0)))
        held = stack.controller.states["fn7"].instances
    assert {i.id for i in t.instances} == set(held)  # the one it has had all along, from the snapshot
    life = next(i for i in t.instances if i.reason == "alive at the snapshot")
    # The retention guard snapshots at any moment, a request under way too: the instance is drawn busy for exactly
    # the requests its stream holds after (assigned or released there).
    assert [r for _, _, r in life.busy] == since and all(end for _, end, _ in life.busy)


async def drawn_from_one_snapshot(nc, key: str) -> tuple[Timeline, Snapshot]:
    """The function's timeline, and the snapshot it began from (none newer was taken while it was read)."""
    for _ in range(20):  # the stream no longer grows: the guard's snapshots soon stop changing
        before = (await replay.origin(nc, key)).snaps[partition(key)]
        t = await replay.timeline(nc, key)
        after = (await replay.origin(nc, key)).snaps[partition(key)]
        if before is not None and after is not None and before.seq == after.seq:
            return t, after
    raise AssertionError(f"{key}'s partition has no snapshot that stays put")


async def served_after(nc, key: str, seq: int) -> list[str]:
    """The requests the function's batches above `seq` assign or release, in the order they first appear."""
    found: dict[str, None] = {}

    def served(_: int, b: Batch) -> None:
        found.update((e.request_id, None) for e in b.events if isinstance(e, Assigned | Released))

    await stream.read(nc.jetstream(), served, function_events(key), after_seq=seq)
    return list(found)


def test_lanes_are_the_instances_states_per_column_and_add_up_to_those_alive():
    life = Life(id="i", wanted_ms=0, created_ms=100, ready_ms=1_000, busy=[(1_000, 3_000, "r1"), (6_000, 7_000, "r2")])
    gone = Life(id="j", wanted_ms=2_000, created_ms=2_100, ready_ms=2_500, retired_ms=4_000, gone_ms=4_500)
    t = Timeline(key="f", instances=[life, gone])
    fig, rebin = draw.lanes_figure(t, end_ms=10_000)
    by_state = {trace.name: list(trace.y) for trace in fig.data}
    width = 10_000 / draw.COLUMNS
    # Over the whole run each state's counts, times the column width, are its instance-ms.
    spent = {name: sum(y) * width for name, y in by_state.items()}
    assert spent["starting"] == pytest.approx(1_000 + 500)
    assert spent["busy"] == pytest.approx(2_000 + 1_000)
    assert spent["idle"] == pytest.approx(3_000 + 3_000 + 1_500)  # i: 3-6 s and 7-10 s; j: 2.5-4 s
    assert spent["retiring"] == pytest.approx(500)
    alive = [sum(column) for column in zip(*by_state.values(), strict=True)]
    assert max(alive) == pytest.approx(2) and alive[-1] == pytest.approx(1)
    assert rebin["states"]["busy"] == [1_000, 2_000, 5_000, 1_000]  # what the page re-bins on zoom: by start,
    assert rebin["states"]["retiring"] == [4_000, 500]  # each as (start - the one before, length)


def test_binning_never_stalls_on_an_edge_a_float_cannot_hold():
    width = 10_000 / 3  # 3333.33...: a bin's edge is not a float the interval's end meets exactly
    assert draw.binned([(0, 10_000), (3_333, 6_667)], 0, width, 3) == pytest.approx(
        [1.0 + 0.0003, 2.0, 1.0 + 0.0001], abs=1e-3
    )


def test_reasons_keep_their_numbers_as_ranges():
    counted = report._counted(
        ["keep-alive 12s (p99 30 s)", "keep-alive 310s (p99 30 s)", "fixed 5s", "keep-alive 40s (p99 30 s)"]
    )
    assert counted == ["keep-alive 12-310s (p99 30 s) x3", "fixed 5s x1"]
    assert report._counted(["", ""]) == ["(no reason given) x2"]


def test_a_comparison_measures_both_runs_lost_score_against_one_baseline(tmp_path, capsys):
    demo, page_path = tmp_path / "demo.json", tmp_path / "learned.html"
    assert simulate_cli(capsys, SMOKE, "--offline", "--policy", "demo", "--save-run", demo)[0] == 0
    mine = tmp_path / "learned.json"
    code, _, _ = simulate_cli(
        capsys, SMOKE, "--offline", "--policy", "learned", "--report", page_path, "--compare", demo, "--save-run", mine
    )
    assert code == 0
    base, run, page = report.load(demo.read_bytes()), report.load(mine.read_bytes()), page_path.read_text()
    assert "both measured against the totals of function_smoke_test: offline, policy demo" in page
    worst = run.functions[0]
    against = worst.lost_against(base.stats)
    assert against != pytest.approx(worst.lost_score)  # its own totals would say another figure
    assert f"{worst.key}: lost {against:.3f} points against the baseline" in page
    theirs = next(f for f in base.functions if f.key == worst.key)
    assert theirs.lost_against(base.stats) == pytest.approx(theirs.lost_score)  # the baseline's own, unchanged


def test_one_cold_start_count_on_the_page(tmp_path, capsys):
    html, saved = tmp_path / "run.html", tmp_path / "run.json"
    assert (
        simulate_cli(capsys, SMOKE, "--offline", "--policy", "learned", "--report", html, "--save-run", saved)[0] == 0
    )
    run, page = report.load(saved.read_bytes()), html.read_text()
    for f in run.functions:  # the function's cold starts, its timeline's waits for a start: the same requests
        t = run.timeline(f.key)
        assert sum(w.cold for w in t.waits) == f.cold_starts
    worst = run.functions[0]
    assert f"{worst.cold_starts:,} cold starts ({worst.cold_start_rate:.1%})" in page
    assert "Cold starts are requests that waited for an instance being started" in page


def test_the_page_shows_the_papers_metrics(tmp_path, capsys):
    html, stats = tmp_path / "run.html", tmp_path / "stats.json"
    assert simulate_cli(capsys, SMOKE, "--offline", "--policy", "demo", "--report", html, "--json", stats)[0] == 0
    printed, page = json.loads(stats.read_text()), html.read_text()
    assert f"cold-start rate<b>{printed['coldStartRate']:.2%}</b>" in page
    assert f"wasted memory GB·s<b>{printed['wastedMemoryTimeInGBs']:,.0f}</b>" in page
    assert "wait p50 / p99 / max<b>" in page
