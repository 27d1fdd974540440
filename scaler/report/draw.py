"""Figures of timelines and the HTML page to hold them, drawn with Plotly.

A page loads plotly.js from a file beside it (`write` puts it there once per folder), so a folder of
pages holds it once and opens from disk with no network. Timelines are one trace per kind of segment,
the segments separated by gaps, drawn with WebGL (`scattergl`) once they are many, so a function with
thousands of instances and requests still draws at once. Above them, the same instances as shares per
pixel column (`lanes_figure`): what a run of hours shows at its default zoom, re-binned in the page to
whatever the zoom shows.
"""

import datetime
import html
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
import plotly.io
import plotly.offline
from plotly.subplots import make_subplots

from scaler.controller.core.features import GAP_BINS
from scaler.report.timeline import Life, Timeline

# What an instance is doing, and its colour on the time axis.
CREATE = ("CreateSlot", "#9e9e9e")
INIT = ("Init", "#ff9800")
BUSY = ("busy", "#1f77b4")
IDLE = ("idle", "#a5d6a7")
RETIRING = ("retiring", "#e57373")
MAX_ROWS = 200  # instances drawn of one function; a bigger one is drawn where its starts were densest
MIN_WINDOW_MS = 60_000  # ... over a minute at least
MAX_SPELLS = 2_500  # ... and busy spells: a function busy with thousands of requests is cut shorter
WEBGL_FROM = 5_000  # points in a figure from which it is drawn with WebGL
KINDS = {"create": CREATE, "init": INIT, "idle": IDLE, "busy": BUSY, "retiring": RETIRING}
PLOTLY_JS = f"plotly-{plotly.offline.get_plotlyjs_version()}.min.js"  # beside every page: the figures' code
COLD = "#d62728"
PREWARM = "#9467bd"
WARM_WAIT = "#17becf"


def clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]


def span(ms: float) -> str:
    """A duration the way a person reads it."""
    s = ms / 1000
    if s < 1:
        return f"{ms:.0f} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


@dataclass
class Segments:
    """Horizontal segments of one kind, as one trace, clipped to the time window drawn."""

    name: str
    color: str
    lo: int
    hi: int
    x: list = field(default_factory=list)
    y: list = field(default_factory=list)
    text: list = field(default_factory=list)

    def add(self, start: int, end: int, row: int, text: str) -> None:
        start, end = max(start, self.lo), min(end, self.hi)
        if end <= start:
            return
        self.x += [start, end, None]
        self.y += [row, row, None]
        self.text += [text, "", None]  # said once, at its start: the page stays small

    def trace(self, width: float, kind: type = go.Scatter) -> go.Scatter | go.Scattergl:
        return kind(
            x=self.x,
            y=self.y,
            text=self.text,
            mode="lines",
            name=self.name,
            line={"color": self.color, "width": width},
            hoverinfo="text",
            connectgaps=False,
        )


@dataclass
class Window:
    """What of a function's timeline is drawn: every instance, or, for a big one, those alive around
    where its starts were densest (a person reads a few hundred rows, not thousands)."""

    lives: list[Life]
    lo: int
    hi: int
    note: str = ""

    @classmethod
    def of(cls, t: Timeline, end_ms: int, rows: int = MAX_ROWS, spells: int = MAX_SPELLS) -> "Window":
        lives = sorted(t.instances, key=lambda i: (i.wanted_ms, i.id))
        lo, hi, note = min((i.wanted_ms for i in lives), default=t.first_ms), end_ms, ""
        if len(lives) > rows:
            at = [life.wanted_ms for life in lives]  # the `rows` starts closest together in time
            first = min(range(len(lives) - rows + 1), key=lambda i: at[i + rows - 1] - at[i])
            lo = lives[first].wanted_ms
            hi = max(lives[first + rows - 1].wanted_ms, lo + MIN_WINDOW_MS)
            note = "where starts were densest"
        busy = sorted(start for life in lives for start, _, _ in life.busy if lo <= start <= hi)
        if len(busy) > spells:
            hi = max(busy[spells], lo + 1000)
            note = note or f"its first {spells:,} requests"
        if not note:
            return cls(lives, lo, hi)
        inside = [life for life in lives if lo <= life.wanted_ms <= hi]
        before = [life for life in lives if life.wanted_ms < lo and (life.gone_ms or end_ms) >= lo]
        shown = before[max(0, len(before) - (2 * rows - len(inside))) :] + inside  # the latest of those before
        return cls(shown, lo, hi, f"{len(shown):,} of {len(lives):,} instances, {note} ({span(hi - lo)})")


def spans(life: Life, end_ms: int) -> Iterator[tuple[str, int, int, str]]:
    """An instance's life as (kind of KINDS, start, end, the request for busy spells), in order."""
    gone = life.gone_ms or end_ms
    created = life.created_ms or life.ready_ms or gone
    yield "create", life.wanted_ms, created, ""
    if life.ready_ms:
        yield "init", created, life.ready_ms, ""
    serving_until = life.retired_ms or gone
    free_from = life.ready_ms
    for start, end, request in life.busy:
        end = end or serving_until
        if free_from and start > free_from:
            yield "idle", free_from, start, ""
        yield "busy", start, end, request
        free_from = end
    if free_from and serving_until > free_from:
        yield "idle", free_from, serving_until, ""
    if life.retired_ms:
        yield "retiring", life.retired_ms, gone, ""


def _lives(keeps: dict[tuple[str, int], str], end_ms: int, segments: dict[str, Segments], row: int, life: Life) -> None:
    """One instance's row: creating, Init, idle and busy spells, retiring."""
    for kind, start, end, request in spans(life, end_ms):
        match kind:
            case "create":
                why = f"{life.id}: started {'for ' + life.for_request if life.for_request else 'ahead of demand'}"
                text = f"{why} ({life.reason})<br>CreateSlot {span(end - start)}"
            case "init":
                text = f"{life.id}: Init {span(end - start)}"
            case "busy":
                text = f"{life.id}: {request} ran {span(end - start)}"
            case "idle":
                text = _idle(life, start, end, keeps)
            case _:
                said = f" ({html.escape(life.retire_reason)})" if life.retire_reason else ""
                text = f"{life.id}: retired{said}"
        segments[kind].add(start, end, row, text)


def _idle(life: Life, start: int, end: int, keeps: dict[tuple[str, int], str]) -> str:
    why = keeps.get((life.id, start))
    said = f"<br>keep-alive: {html.escape(why)}" if why else ""
    return f"{life.id}: idle {span(end - start)}{said}"


def timeline_figure(t: Timeline, end_ms: int, title: str = "", origin_ms: int = 0) -> go.Figure:
    """The function's instances on a time axis (one row each), and below, the requests that waited."""
    w = Window.of(t, end_ms)
    lives = w.lives
    keeps = {(k.instance_id, k.at_ms): k.why for k in t.keeps}
    segments = {k: Segments(name, color, w.lo, w.hi) for k, (name, color) in KINDS.items()}
    for row, life in enumerate(lives):
        _lives(keeps, end_ms, segments, row, life)
    waits = [x for x in t.waits if w.lo <= x.arrived_ms <= w.hi]
    rows = max(len(lives), 1)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.68, 0.32],
        vertical_spacing=0.06,
        subplot_titles=(w.note or f"{len(lives)} instances", f"{len(waits):,} requests waited"),
    )
    width = max(1.5, min(14.0, 260 / rows))
    kind = scatter(sum(len(seg.x) for seg in segments.values()))
    for seg in segments.values():
        fig.add_trace(_shifted(seg.trace(width, kind), origin_ms), row=1, col=1)
    starts = [(row, life) for row, life in enumerate(lives) if w.lo <= life.wanted_ms <= w.hi]
    for cold, name, color, symbol in (
        (True, "started for a waiting request", COLD, "triangle-right"),
        (False, "pre-warm", PREWARM, "diamond"),
    ):
        picked = [(row, life) for row, life in starts if life.cold == cold]
        fig.add_trace(
            kind(
                x=[life.wanted_ms + origin_ms for _, life in picked],
                y=[row for row, _ in picked],
                text=[
                    f"{life.id} {name} at {clock(life.wanted_ms + origin_ms)}<br>{html.escape(life.reason)}"
                    for _, life in picked
                ],
                mode="markers",
                name=f"{name} (reason on hover)",
                hoverinfo="text",
                marker={"color": color, "symbol": symbol, "size": 8},
            ),
            row=1,
            col=1,
        )
    gone = [(row, life) for row, life in enumerate(lives) if life.gone_ms and w.lo <= life.gone_ms <= w.hi]
    fig.add_trace(
        kind(
            x=[life.gone_ms + origin_ms for _, life in gone],
            y=[row for row, _ in gone],
            text=[f"{life.id} destroyed at {clock(life.gone_ms + origin_ms)}" for _, life in gone],
            mode="markers",
            name="destroyed",
            hoverinfo="text",
            marker={"color": "black", "symbol": "x-thin-open", "size": 7, "line": {"width": 2}},
        ),
        row=1,
        col=1,
    )
    for cold, name, color in ((True, "waited for a start", COLD), (False, "waited for a busy instance", WARM_WAIT)):
        picked = [x for x in waits if x.cold == cold]
        fig.add_trace(
            scatter(len(waits))(
                x=[x.arrived_ms + origin_ms for x in picked],
                y=[(x.served_ms - x.arrived_ms) / 1000 for x in picked],
                text=[f"{x.request_id} waited {span(x.served_ms - x.arrived_ms)} for {x.instance_id}" for x in picked],
                mode="markers",
                name=name,
                hoverinfo="text",
                marker={"color": color, "size": 5},
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text="instance", autorange="reversed", showticklabels=rows <= 40, row=1, col=1)
    fig.update_yaxes(title_text="wait (s)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="date", row=2, col=1)
    fig.update_xaxes(type="date", row=1, col=1)
    fig.update_layout(
        title=title or t.key,
        height=int(min(900, 320 + 12 * rows)),
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.08},
        hovermode="closest",
    )
    return fig


COLUMNS = 1_000  # about the pixel columns of a figure's plot area: lanes are binned to this many spans
STATES = (  # an instance's state in the lanes' shares, the kinds of segment it covers, and its colour
    ("starting", ("create", "init"), INIT[1]),
    ("busy", ("busy",), BUSY[1]),
    ("idle", ("idle",), IDLE[1]),
    ("retiring", ("retiring",), RETIRING[1]),
)


def binned(intervals: Iterable[tuple[int, int]], lo: float, width: float, bins: int) -> list[float]:
    """How many intervals were alive in each of `bins` spans of `width` ms from `lo`, on average over the span.
    (The page's LOADER re-bins the same way, in `bin`, for what a zoom shows.)"""
    out = [0.0] * bins
    hi = lo + width * bins
    for start, end in intervals:
        start, end = max(start, lo), min(end, hi)
        if start >= end:
            continue
        first, last = int((start - lo) // width), min(int((end - lo) // width), bins - 1)
        for b in range(first, last + 1):
            overlap = min(end, lo + (b + 1) * width) - max(start, lo + b * width)
            if overlap > 0:
                out[b] += overlap / width
    return out


def lanes_figure(t: Timeline, end_ms: int, origin_ms: int = 0) -> tuple[go.Figure, dict]:
    """The function's instances as counts per state (starting, busy, idle, retiring), stacked, per pixel
    column of the run: every instance at once, where one row each would be thinner than a pixel. With the
    intervals the page re-bins on zoom, so the columns stay a pixel wide whatever the zoom."""
    by_state: dict[str, list[int]] = {name: [] for name, _, _ in STATES}
    state_of = {kind: name for name, kinds, _ in STATES for kind in kinds}
    for life in t.instances:
        for kind, start, end, _ in spans(life, end_ms):
            if end > start:
                by_state[state_of[kind]] += [start, end]
    lo = min((life.wanted_ms for life in t.instances), default=t.first_ms)
    hi = max(end_ms, lo + 1)
    width = (hi - lo) / COLUMNS
    x = [origin_ms + lo + (i + 0.5) * width for i in range(COLUMNS)]
    fig = go.Figure()
    for name, _, color in STATES:
        pairs = zip(by_state[name][::2], by_state[name][1::2], strict=True)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=binned(pairs, lo, width, COLUMNS),
                name=name,
                mode="lines",
                stackgroup="lanes",
                line={"width": 0, "color": color},
                hovertemplate="%{y:.2f} instances " + name + "<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"{len(t.instances):,} instances by state, per pixel column (zoom in: re-binned to the zoom)",
        height=260,
        xaxis={"type": "date"},
        yaxis={"title": "instances", "rangemode": "tozero"},
        margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        hovermode="x unified",
    )
    states = {name: packed(zip(flat[::2], flat[1::2], strict=True), lo) for name, flat in by_state.items()}
    rebin = {"origin": origin_ms, "lo": lo, "hi": hi, "columns": COLUMNS, "states": states}
    return fig, rebin


def packed(intervals: Iterable[tuple[int, int]], lo: int) -> list[int]:
    """Intervals as the page reads them, small: by start, each as (start - the previous start, length);
    the first start from `lo`. (The page's `unpack` undoes it.)"""
    out, at = [], lo
    for start, end in sorted(intervals):
        out += [start - at, end - start]
        at = start
    return out


def scatter(points: int) -> type:
    """SVG for a few points (quick to draw, no WebGL context), WebGL for many (SVG would crawl)."""
    return go.Scattergl if points > WEBGL_FROM else go.Scatter


def _shifted(trace: go.Scattergl, origin_ms: int) -> go.Scattergl:
    if origin_ms:
        trace.x = [x + origin_ms if x is not None else None for x in trace.x]
    return trace


def bin_label(b: int) -> str:
    """A gap bin (half-octaves from 1 ms, features.gap_bin) by its lower edge."""
    return span(2 ** (b / 2))


def gaps_figure(t: Timeline, title: str = "") -> go.Figure:
    """The gaps between its requests against the keep-alives the policy chose, as shares per half-octave."""
    labels = [bin_label(b) for b in range(GAP_BINS)]
    series = (
        ("gaps seen (whole run)", t.gaps_seen, "#7f7f7f"),
        ("gaps the policy learned (decayed, at the end)", t.gaps_learned, "#1f77b4"),
        ("keep-alives chosen", t.keep_alive_bins(), "#d62728"),
    )
    used = [b for b in range(GAP_BINS) if any(s and b < len(s) and s[b] for _, s, _ in series)]
    lo, hi = (min(used), max(used) + 1) if used else (0, GAP_BINS)
    fig = go.Figure()
    for name, counts, color in series:
        total = sum(counts)
        if not total:
            continue
        fig.add_trace(
            go.Bar(
                x=labels[lo:hi],
                y=[c / total for c in counts[lo:hi]],
                name=f"{name}, n={total:,.0f}",
                marker_color=color,
                hovertemplate="%{x}: %{y:.1%}<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(
        title=title or f"{t.key}: gaps against keep-alives",
        barmode="group",
        height=320,
        yaxis={"tickformat": ".0%", "title": "share"},
        xaxis={"title": "gap or keep-alive (half-octave bins)"},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h", "y": 1.12},
    )
    return fig


# --- the page ---------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.scores { display: flex; gap: 1.5em; flex-wrap: wrap; }
.score { border: 1px solid #ddd; border-radius: 6px; padding: .6em 1em; min-width: 10em; }
.score b { display: block; font-size: 1.6em; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
table { border-collapse: collapse; font-size: .9em; } td, th { padding: .2em .6em; text-align: right; }
td:first-child, th:first-child { text-align: left; } tr:nth-child(even) { background: #f6f6f6; }
.note { color: #666; font-size: .9em; } .missing { color: #b00; font-weight: bold; }
pre { font-size: .8em; overflow-x: auto; max-height: 30em; }
"""


# Figures are drawn as they come into view (a big run's page holds a dozen, each with thousands of
# points: drawn at once they would keep the page blank for seconds); with `#all` in the address,
# all at once. `data-drawn-ms` on <body> says when the first screen (or, with #all, every figure)
# was drawn, in ms since navigation: what scripts/render_check.py reports.
LOADER = """
if (typeof Plotly === 'undefined') {
  const said = document.createElement('p');
  said.className = 'missing';
  said.textContent = `${PLOTLY_JS} is not beside this page: copy it with the page (scaler writes it there)`;
  document.body.prepend(said);
}
const plots = [...document.querySelectorAll('div.plot')];
const toMs = (v) => typeof v === 'number' ? v : Date.parse(String(v).replace(' ', 'T') + 'Z');
// Counts alive per span, as draw.py's `binned`: intervals are [start, end, start, end, ...] in ms.
const bin = (flat, lo, width, bins) => {
  const out = new Array(bins).fill(0), hi = lo + width * bins;
  for (let i = 0; i < flat.length; i += 2) {
    const start = Math.max(flat[i], lo), end = Math.min(flat[i + 1], hi);
    if (start >= end) continue;
    const last = Math.min(Math.floor((end - lo) / width), bins - 1);
    for (let b = Math.floor((start - lo) / width); b <= last; b++) {
      const overlap = Math.min(end, lo + (b + 1) * width) - Math.max(start, lo + b * width);
      if (overlap > 0) out[b] += overlap / width;
    }
  }
  return out;
};
// draw.py's `packed` undone: [start, end, start, end, ...] in ms from the run's start.
const unpack = (deltas, lo) => {
  const flat = new Array(deltas.length);
  let at = lo;
  for (let i = 0; i < deltas.length; i += 2) {
    at += deltas[i];
    flat[i] = at;
    flat[i + 1] = at + deltas[i + 1];
  }
  return flat;
};
// Lanes: re-binned to what the zoom shows, and the figure that follows (the instances' rows) zoomed alike.
const rebin = (div) => {
  const r = JSON.parse(document.getElementById(div.id + '-rebin').textContent);
  const names = Object.keys(r.states);
  names.forEach((name) => { r.states[name] = unpack(r.states[name], r.lo); });
  div.on('plotly_relayout', (ev) => {
    let lo = r.lo, hi = r.hi;
    if (ev['xaxis.range[0]'] !== undefined) {
      lo = toMs(ev['xaxis.range[0]']) - r.origin; hi = toMs(ev['xaxis.range[1]']) - r.origin;
    } else if (ev['xaxis.range']) {
      lo = toMs(ev['xaxis.range'][0]) - r.origin; hi = toMs(ev['xaxis.range'][1]) - r.origin;
    } else if (!ev['xaxis.autorange']) return;
    const width = Math.max((hi - lo) / r.columns, 1), n = Math.ceil((hi - lo) / width);
    const x = Array.from({length: n}, (_, i) => r.origin + lo + (i + 0.5) * width);
    const y = names.map((name) => bin(r.states[name], lo, width, n));
    Plotly.restyle(div, {x: names.map(() => x), y: y}, names.map((_, i) => i));
    const next = document.getElementById(div.dataset.follow || '');
    if (next && next.dataset.drawn) {
      const range = ev['xaxis.autorange'] ? {'xaxis.autorange': true, 'xaxis2.autorange': true}
        : {'xaxis.range': [r.origin + lo, r.origin + hi], 'xaxis2.range': [r.origin + lo, r.origin + hi]};
      Plotly.relayout(next, range);
    }
  });
};
const draw = (div) => {
  if (div.dataset.drawn) return Promise.resolve();
  div.dataset.drawn = '1';
  const fig = JSON.parse(document.getElementById(div.id + '-data').textContent);
  const drawing = Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
  return div.dataset.rebin ? drawing.then(() => rebin(div)) : drawing;
};
const drawn = (promises) => Promise.all(promises).then(() => {
  document.body.dataset.drawnMs = performance.now().toFixed(0);
});
if (location.hash === '#all') {
  drawn(plots.map(draw));
} else {
  let first = true;
  const seen = new IntersectionObserver((entries) => {
    const now = entries.filter((e) => e.isIntersecting).map((e) => {
      seen.unobserve(e.target);
      return draw(e.target);
    });
    if (first) { first = false; drawn(now); }
  }, {rootMargin: '400px'});
  plots.forEach((div) => seen.observe(div));
}
"""


class Page:
    """An HTML page: headings, text, tables and Plotly figures, plotly.js loaded from the file beside it."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self._figures = 0

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def text(self, text: str, cls: str = "") -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{attr}>{html.escape(text)}</p>")

    def scores(self, figures: Iterable[tuple[str, str]]) -> None:
        cells = "".join(f'<div class="score">{html.escape(n)}<b>{html.escape(v)}</b></div>' for n, v in figures)
        self.parts.append(f'<div class="scores">{cells}</div>')

    def table(self, header: list[str], rows: Iterable[list]) -> None:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def ahead(self, n: int) -> str:
        """The id the n-th figure made from now will have (1: the next)."""
        return f"fig{self._figures + n}"

    def figure(self, fig: go.Figure, rebin: dict | None = None, follow: str = "") -> str:
        """A place for the figure, its height kept, and its data; LOADER draws it when it comes into view.
        With `rebin` (lanes_figure's), it is re-binned on zoom, and zooms the figure `follow` alike."""
        self._figures += 1
        div = f"fig{self._figures}"
        data = plotly.io.to_json(fig, validate=False).replace("</", "<\\/")
        height = fig.layout.height or 450
        attrs, extra = "", ""
        if rebin is not None:
            attrs = f' data-rebin="1" data-follow="{follow}"'
            extra = (
                f'<script type="application/json" id="{div}-rebin">{json.dumps(rebin, separators=(",", ":"))}</script>'
            )
        return (
            f'<div class="plot" id="{div}" style="height:{height}px"{attrs}></div>'
            f'<script type="application/json" id="{div}-data">{data}</script>{extra}'
        )

    def add(self, fig: go.Figure, rebin: dict | None = None, follow: str = "") -> None:
        self.parts.append(self.figure(fig, rebin, follow))

    def side_by_side(self, left: str, right: str) -> None:
        self.parts.append(f'<div class="side"><div>{left}</div><div>{right}</div></div>')

    def lines(self, lines: Iterable[str]) -> None:
        self.parts.append("<pre>" + html.escape("\n".join(lines)) + "</pre>")

    def html(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{STYLE}</style>"
            f'<script type="text/javascript" src="{PLOTLY_JS}"></script></head>'
            f"<body><h1>{html.escape(self.title)}</h1>{''.join(self.parts)}"
            f"<script>const PLOTLY_JS = {json.dumps(PLOTLY_JS)};\n{LOADER}</script></body></html>\n"
        )


def write(path: Path, page: str) -> None:
    """The page, and plotly.js beside it unless it is there already: once per folder of pages (OSError as is)."""
    path.write_text(page)
    js = path.parent / PLOTLY_JS
    if not js.exists():
        part = js.with_name(f".{js.name}.{os.getpid()}")
        part.write_text(plotly.offline.get_plotlyjs())
        os.replace(part, js)  # whole or not at all, even with two writers


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.4f}" if abs(v) < 1 else f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
