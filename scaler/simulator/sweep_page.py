"""The page of a sweep, drawn from the runs store: each policy's curve of cold-start rate against wasted
memory time as its knob moves, the challenge's score on each point, the Pareto front marked."""

import json
from pathlib import Path

import plotly.graph_objects as go

from scaler.report.draw import Page, span
from scaler.simulator import runs
from scaler.simulator.sweep import curves, front, reach

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
COLUMNS = "id, policy, knobs, title, cold_start_rate, wasted_memory_time_in_g_bs, wait_p99_in_ms, score, code"


def _label(row: dict) -> str:
    knobs = json.loads(row["knobs"])
    return ", ".join(f"{k}={span(v) if k.endswith('_ms') else f'{v:g}'}" for k, v in knobs.items()) or "defaults"


def curves_figure(rows: list[dict], on_front: list[bool]) -> go.Figure:
    fig = go.Figure()
    by_policy: dict[str, list[dict]] = {}
    for row in rows:
        by_policy.setdefault(row["policy"], []).append(row)
    for n, (policy, points) in enumerate(by_policy.items()):
        points.sort(key=lambda r: r["wasted_memory_time_in_g_bs"])
        fig.add_trace(
            go.Scatter(
                x=[r["wasted_memory_time_in_g_bs"] for r in points],
                y=[100 * r["cold_start_rate"] for r in points],
                mode="lines+markers+text" if len(points) > 1 else "markers+text",
                text=[_label(r) if len(points) > 1 else policy for r in points],
                textposition="top center",
                hovertext=[
                    f"{policy} {_label(r)}<br>cold-start rate {r['cold_start_rate']:.2%}, wasted"
                    f" {r['wasted_memory_time_in_g_bs']:,.0f} GB·s<br>wait p99 {r['wait_p99_in_ms']:,.0f} ms,"
                    f" score {r['score']:.2f} (run {r['id']})"
                    for r in points
                ],
                hoverinfo="text",
                name=policy if len(points) > 1 else f"{policy} (defaults)",
                marker={
                    "color": COLORS[n % len(COLORS)],
                    "size": 9,
                    "symbol": "circle" if len(points) > 1 else "diamond",
                },
                line={"color": COLORS[n % len(COLORS)]},
            )
        )
    best = sorted(
        (r for r, yes in zip(rows, on_front, strict=True) if yes), key=lambda r: r["wasted_memory_time_in_g_bs"]
    )
    fig.add_trace(
        go.Scatter(
            x=[r["wasted_memory_time_in_g_bs"] for r in best],
            y=[100 * r["cold_start_rate"] for r in best],
            mode="lines+markers",
            line={"color": "black", "dash": "dot", "shape": "hv"},
            marker={"size": 16, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 2}},
            name="Pareto front (none better on both)",
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title="cold-start rate against wasted memory time, as each knob moves (lower left is better)",
        xaxis={"type": "log", "title": "wasted memory time (GB·s of instances not running a request)"},
        yaxis={"title": "cold-start rate (% of invocations that waited for a start)", "rangemode": "tozero"},
        height=560,
        margin={"l": 70, "r": 20, "t": 50, "b": 50},
        hovermode="closest",
    )
    return fig


def scores_figure(rows: list[dict], on_front: list[bool]) -> go.Figure:
    labels = [f"{r['policy']} {_label(r)}" + (" *" if yes else "") for r, yes in zip(rows, on_front, strict=True)]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=[r["score"] for r in rows],
            text=[f"{r['score']:.2f}" for r in rows],
            marker_color=["#2ca02c" if yes else "#7f7f7f" for yes in on_front],
            hoverinfo="x+y",
        )
    )
    fig.update_layout(
        title="the challenge's score of each point (green, *: on the Pareto front)",
        yaxis={"title": "score (of 100)", "rangemode": "tozero"},
        height=380,
        margin={"l": 60, "r": 20, "t": 50, "b": 120},
    )
    return fig


async def page(db: Path, sweep_id: str) -> str:
    rows = await runs.query(db, f"SELECT {COLUMNS} FROM runs WHERE sweep = ? ORDER BY id", [sweep_id])
    on_front = front([(r["cold_start_rate"], r["wasted_memory_time_in_g_bs"]) for r in rows])
    trace = rows[0]["title"].split(":")[0] if rows else ""
    p = Page(f"{trace}: the trade-off of {', '.join(dict.fromkeys(r['policy'] for r in rows))}")
    p.text(
        f"{len(rows)} runs of sweep {sweep_id!r}, code {rows[0]['code'] if rows else '?'}, read from {db}; ask it more"
        f" with SQL: SELECT * FROM runs WHERE sweep = '{sweep_id}' (docs/simulation.md, Runs in SQLite)",
        "note",
    )
    p.add(curves_figure(rows, on_front))
    p.add(scores_figure(rows, on_front))
    p.table(
        ["run", "policy", "knobs", "cold-start rate", "wasted GB·s", "wait p99 ms", "score", "Pareto front"],
        [
            [
                r["id"],
                r["policy"],
                _label(r),
                f"{r['cold_start_rate']:.2%}",
                f"{r['wasted_memory_time_in_g_bs']:,.0f}",
                f"{r['wait_p99_in_ms']:,.0f}",
                f"{r['score']:.2f}",
                "yes" if yes else "",
            ]
            for r, yes in zip(rows, on_front, strict=True)
        ],
    )
    for policy, mine, others in curves(rows, lambda r: r["policy"]):  # does each curve reach the other points?
        _reaches(p, policy, mine, others)
    return p.html()


def _reaches(p: Page, policy: str, mine: list[dict], others: list[dict]) -> None:
    def at(r: dict) -> tuple[float, float]:
        return r["cold_start_rate"], r["wasted_memory_time_in_g_bs"]

    curve = [at(r) for r in mine]
    p.heading(f"Where {policy}'s curve reaches the other points")
    p.text(
        f"For each other point: the point of {policy} at least as good on both (as few cold starts, as little wasted"
        " memory time; of several, the one wasting least), or where its curve falls short. Why it falls short where"
        " it does is the trace's to say: docs/policies.md says it for the shared datasets."
    )
    found = [reach(curve, at(r)) for r in others]
    p.table(
        ["point", "cold-start rate", "wasted GB·s", f"{policy} at least as good on both", "where not"],
        [
            [
                f"{r['policy']} {_label(r)}",
                f"{r['cold_start_rate']:.2%}",
                f"{r['wasted_memory_time_in_g_bs']:,.0f}",
                "" if f.by is None else f"{_label(mine[f.by])}: {curve[f.by][0]:.2%}, {curve[f.by][1]:,.0f} GB·s",
                f.short,
            ]
            for r, f in zip(others, found, strict=True)
        ],
    )
