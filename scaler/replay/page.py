"""`scaler replay --key K --html PATH`: one function's replayed timeline as a page.

Its instances on a time axis with the requests that waited (cold starts and keep-alives carry the
policy's reason on hover), the gaps between its requests against the keep-alives chosen, and every
decision in words, as `scaler replay --key K` prints them.
"""

from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState
from scaler.report.draw import Page, gaps_figure, lanes_figure, timeline_figure
from scaler.report.timeline import Timeline

LISTED = 5_000  # decisions listed in words; the newest, when there are more


def replay_page(t: Timeline, s: FnState, st: FnStats, title: str, since: str = "") -> str:
    p = Page(title)
    p.scores(
        [
            ("arrivals", f"{st.arrivals:,}"),
            ("cold starts", f"{sum(w.cold for w in t.waits):,}"),  # requests that waited for a start, as simulate
            ("started for requests", f"{st.cold_starts:,}"),
            ("pre-warms", f"{st.prewarms:,}"),
            ("failures", f"{st.failures:,}"),
            ("waited", f"{st.wait_ms / 1000:,.1f} s"),
            ("instances now", f"{len(s.instances):,}"),
            ("decisions", f"{len(t.steps):,}"),
        ]
    )
    if since:
        p.text(f"replayed{since}: what came before is not shown", "note")
    end = t.steps[-1].at_ms if t.steps else t.last_ms
    fig, rebin = lanes_figure(t, end)
    p.add(fig, rebin, follow=p.ahead(2))
    p.add(timeline_figure(t, end, f"{t.key}: instances and waits (hover a start or an idle spell for its reason)"))
    p.add(gaps_figure(t))
    steps = t.steps[-LISTED:]
    p.heading(f"{len(t.steps):,} decisions" + (f", the last {LISTED:,}" if len(t.steps) > LISTED else ""))
    p.lines(step.text for step in steps)
    return p.html()
