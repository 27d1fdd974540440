"""`scaler simulate --report PATH.html`: a run as a page to look at, and `--save-run` to compare it later.

The page: the score and its two halves; every function as a point (slot GB·s wasted against time
spent waiting), the run's instances over time; then, for the functions that lost the most, their
instances on a time axis with the requests that waited, and the gaps between their requests
against the keep-alives the policy chose. With `--compare OTHER.json` (a run saved with
`--save-run`), the other run's score beside this one's, and its timelines of the same functions
beside these.

A saved run (`SavedRun`, JSON) holds the statistics, every function's figures and every
function's timeline, so any function this run finds worst can be drawn from the other run too.
"""

import re
from collections import Counter
from collections.abc import Iterable

import plotly.graph_objects as go

from scaler.report.draw import Page, binned, lanes_figure, scatter, span, timeline_figure
from scaler.report.draw import gaps_figure as _gaps_figure
from scaler.report.timeline import Timeline
from scaler.simulator.saved import DRAWN, SavedRun, load, save
from scaler.simulator.score import SUCCESS_THRESHOLD, FunctionRow, Stats

__all__ = ["DRAWN", "SavedRun", "load", "page", "save"]

POINTS = 600  # the run's instances over time: averages over this many spans of the run


def _score_figures(stats: Stats) -> list[tuple[str, str]]:
    zero = stats.success_rate < SUCCESS_THRESHOLD
    return [
        ("score" + (" (0: too many failures)" if zero else ""), f"{stats.score:.2f}"),
        ("resource usage (of 50)", f"{stats.resource_usage_score:.2f}"),
        ("cold start (of 50)", f"{stats.cold_start_score:.2f}"),
        ("success rate", f"{stats.success_rate:.3%}"),
        ("requests", f"{stats.total_requests_count:,}"),
        ("cold starts", f"{stats.cold_starts:,}"),
        ("slots created", f"{stats.total_live_slot_count:,}"),
        ("slot GB·s", f"{stats.total_slot_time_in_g_bs:,.0f}"),
        # the papers' metrics (docs/simulation.md)
        ("cold-start rate", f"{stats.cold_start_rate:.2%}"),
        ("wasted memory GB·s", f"{stats.wasted_memory_time_in_g_bs:,.0f}"),
        ("wait p50 / p99 / max", " / ".join(span(ms) for ms in _waits(stats))),
    ]


def _waits(stats: Stats) -> tuple[float, float, float]:
    return stats.wait_p50_in_ms, stats.wait_p99_in_ms, stats.wait_max_in_ms


def score_figure(runs: list[SavedRun]) -> go.Figure:
    """The two halves of the score, stacked, one bar per run."""
    names = [r.title for r in runs]
    fig = go.Figure()
    for half, attr, color in (
        ("resource usage: 50 x execution GB·s / slot GB·s", "resource_usage_score", "#2ca02c"),
        ("cold start: 50 x execution / (execution + schedule + idle)", "cold_start_score", "#1f77b4"),
    ):
        values = [getattr(r.stats, attr) for r in runs]
        fig.add_trace(
            go.Bar(y=names, x=values, name=half, orientation="h", marker_color=color, text=[f"{v:.2f}" for v in values])
        )
    fig.update_layout(
        barmode="stack",
        height=140 + 60 * len(runs),
        xaxis={"range": [0, 100], "title": "score (of 100)"},
        margin={"l": 20, "r": 20, "t": 30, "b": 40},
        legend={"orientation": "h", "y": 1.25},
        yaxis={"automargin": True, "autorange": "reversed"},  # this run first, as in the table
    )
    return fig


def functions_figure(run: SavedRun, drawn: set[str]) -> go.Figure:
    """Every function as a point: what its idle slots wasted against how long its requests waited."""
    fig = go.Figure()
    for worst, color in ((False, "#7f7f7f"), (True, "#d62728")):
        rows = [f for f in run.functions if (f.key in drawn) == worst]
        fig.add_trace(
            scatter(len(run.functions))(
                x=[max(f.slot_g_bs - f.execution_g_bs, 0.01) for f in rows],
                y=[max(f.schedule_secs, 0.01) for f in rows],
                text=[
                    f"{f.key}<br>lost {f.lost_score:.3f} points, {f.requests:,} requests, {f.cold_starts:,} cold starts"
                    for f in rows
                ],
                mode="markers",
                hoverinfo="text",
                name="drawn below" if worst else "other functions",
                marker={"color": color, "size": [6 + min(f.lost_score * 8, 20) for f in rows], "opacity": 0.7},
            )
        )
    fig.update_layout(
        title=f"{len(run.functions)} functions: idle slot GB·s against waiting (size: score lost)",
        xaxis={"type": "log", "title": "slot GB·s beyond execution"},
        yaxis={"type": "log", "title": "schedule s"},
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def instances_figure(run: SavedRun) -> go.Figure:
    """The run's instances over time, summed over its functions: alive (paid for), and busy."""
    end = run.end_ms
    start = min((i.wanted_ms for t in run.timelines for i in t.instances), default=0)
    alive = ((i.wanted_ms, i.gone_ms or end) for t in run.timelines for i in t.instances)
    busy = ((s, e or end) for t in run.timelines for i in t.instances for s, e, _ in i.busy)
    bin_ms = max(1000, (end - start) // POINTS)
    bins = (end - start) // bin_ms + 1
    x = [run.origin_ms + start + b * bin_ms for b in range(bins)]
    fig = go.Figure()
    for name, series, color in (("alive (slot paid)", alive, "#ff7f0e"), ("busy", busy, "#1f77b4")):
        y = binned(((s, min(e, end)) for s, e in series), start, bin_ms, bins)
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines", line={"color": color}))
    which = "all functions" if len(run.timelines) >= len(run.functions) else f"the {len(run.timelines)} drawn functions"
    fig.update_layout(
        title=f"instances over time, {which} (averages over {span(bin_ms)})",
        height=320,
        xaxis={"type": "date"},
        yaxis={"title": "instances", "rangemode": "tozero"},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _row(f: FunctionRow, lost: float) -> list:
    return [f.key, f.requests, f.cold_starts, f.wait_p99_ms, f.schedule_secs, f.execution_g_bs, f.slot_g_bs, lost]


HEADER = ["metaKey", "requests", "cold starts", "wait p99 ms", "schedule s", "execution GB·s", "slot GB·s"]


def page(run: SavedRun, other: SavedRun | None = None, drawn: int = DRAWN) -> str:
    """The run's page; with `other`, that run beside it, and every function's lost score measured against
    the other run's totals (the baseline), so that the two columns compare."""
    title = run.title if other is None else f"{run.title} vs {other.title}"
    p = Page(title)
    p.lines(run.heading)
    if other is None:
        p.scores(_score_figures(run.stats))
    else:
        rows = [(r.title, _score_figures(r.stats)) for r in (run, other)]
        p.table(["run", *(name for name, _ in rows[0][1])], [[title, *(v for _, v in f)] for title, f in rows])
    p.add(score_figure([run] if other is None else [run, other]))
    if run.note:
        p.text(run.note, "note")
    worst = [f.key for f in run.functions[:drawn]]
    p.heading("Functions")
    p.add(functions_figure(run, set(worst)))
    if run.timelines:
        p.add(instances_figure(run))
    p.heading(f"The {len(worst)} functions that lost the most")
    if other is None:
        p.table([*HEADER, "score lost"], [_row(f, f.lost_score) for f in run.functions[:drawn]])
        p.text(COLD_STARTS, "note")
    else:
        theirs = {f.key: f for f in other.functions}
        rows = [
            [*_row(f, f.lost_against(other.stats)), theirs[f.key].lost_score if f.key in theirs else "-"]
            for f in run.functions[:drawn]
        ]
        p.table([*HEADER, "score lost here", "score lost there"], rows)
        p.text(
            f"Score lost here and there are both measured against the totals of {other.title} (its slot GB·s and"
            " its time waiting): what a function costs out of the same budget, so the two compare. " + COLD_STARTS,
            "note",
        )
    for f in run.functions[:drawn]:
        _function(p, f, run, other)
    return p.html()


COLD_STARTS = (
    "Cold starts are requests that waited for an instance being started, everywhere on this page (the"
    " papers' count); instances started for waiting requests are counted apart, as starts."
)


def _function(p: Page, f: FunctionRow, run: SavedRun, other: SavedRun | None) -> None:
    their = next((o for o in other.functions if o.key == f.key), None) if other is not None else None
    mine = run.timeline(f.key)
    lost = f.lost_score if other is None else f.lost_against(other.stats)
    p.heading(f"{f.key}: lost {lost:.3f} points" + ("" if other is None else " against the baseline's totals"))
    said = f"{f.requests:,} requests, {_said(f, mine)}"
    if their is not None:
        said += f"; in {other.title}: lost {their.lost_score:.3f}, {_said(their, other.timeline(f.key))}"
    p.text(said, "note")
    if mine is not None:
        p.text(_reasons(mine), "note")
    if other is None:
        if mine is None:
            p.text("no timeline for this function (its events were not read)", "note")
            return
        fig, rebin = lanes_figure(mine, run.end_ms, run.origin_ms)
        p.add(fig, rebin, follow=p.ahead(2))
        p.add(timeline_figure(mine, run.end_ms, f"{f.key}: instances and waits", run.origin_ms))
        p.add(_gaps_figure(mine))
        return
    yours = other.timeline(f.key)
    pairs = ((run, mine), (other, yours))
    lanes = [lanes_figure(t, r.end_ms, r.origin_ms) if t else None for r, t in pairs]
    p.side_by_side(*(p.figure(*drawn, follow=p.ahead(3)) if drawn else "" for drawn in lanes))
    p.side_by_side(*(_drawn(p, r, t, f.key) for r, t in pairs))
    p.side_by_side(*(p.figure(_gaps_figure(t, r.title)) if t else "" for r, t in pairs))


def _said(f: FunctionRow, t: Timeline | None) -> str:
    """Its cold starts (requests that waited for a start), and apart, the instances started and why."""
    said = f"{f.cold_starts:,} cold starts ({f.cold_start_rate:.1%})"
    if t is not None:
        started = sum(life.cold for life in t.instances)
        said += f"; {started:,} instances started for waiting requests, {len(t.instances) - started:,} pre-warmed"
    return said + f"; waited {span(f.schedule_secs * 1000)} in all, p99 {span(f.wait_p99_ms)}"


def _drawn(p: Page, run: SavedRun, t: Timeline | None, key: str) -> str:
    if t is None:
        return f"<p class=note>{run.title} has no timeline of {key}</p>"
    return p.figure(timeline_figure(t, run.end_ms, run.title, run.origin_ms))


def _reasons(t: Timeline) -> str:
    """Why its instances were started and kept, counted by kind: what the timeline's hover says one by one."""
    said = "; ".join(_counted(life.reason for life in t.instances))
    if t.keeps:
        said += " | kept alive: " + "; ".join(_counted(k.why for k in t.keeps))
    return f"instances started: {said}"


NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _counted(reasons: Iterable[str], top: int = 4) -> list[str]:
    """The commonest kinds of reason, as `reason xN`; reasons differing only in numbers are one kind, said
    with each number's range over them (`keep-alive 12-310 s`)."""
    kinds: Counter[str] = Counter()
    numbers: dict[str, list[list[float]]] = {}
    for reason in reasons:
        reason = reason or "(no reason given)"
        kind = NUMBER.sub("#", reason)
        kinds[kind] += 1
        values = [float(v) for v in NUMBER.findall(reason)]
        seen = numbers.setdefault(kind, [[] for _ in values])
        for at, v in enumerate(values):
            seen[at].append(v)
    return [f"{_filled(k, numbers[k])} x{n:,}" for k, n in kinds.most_common(top)]


def _filled(kind: str, numbers: list[list[float]]) -> str:
    """The kind with its numbers put back: one value where they agree, their range where they differ."""
    parts = kind.split("#")
    out = [parts[0]]
    for values, rest in zip(numbers, parts[1:], strict=True):
        lo, hi = min(values), max(values)
        out.append(f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}")
        out.append(rest)
    return "".join(out)
