"""A run kept to be drawn again or compared (`--save-run`, `--compare`): its data, nothing drawn.

Apart from the page (scaler/simulator/report.py) so that keeping and reading runs needs no plotly.
"""

import msgspec

from scaler.report.timeline import Timeline
from scaler.simulator.score import FunctionRow, Stats

DRAWN = 6  # functions drawn in full: those that lost the most


class SavedRun(msgspec.Struct, kw_only=True):
    """What `--save-run` writes and `--compare` reads: one run, enough to draw it again."""

    title: str  # e.g. "dataSet_3: offline, policy learned"
    heading: list[str]  # what `scaler simulate` printed above the statistics
    stats: Stats
    functions: list[FunctionRow]  # every function, the one that lost the most first
    timelines: list[Timeline]  # every function's that could be folded (live: those read from the stream)
    origin_ms: int = 0  # add to a timeline's times for epoch ms (offline runs start at 0)
    end_ms: int = 0  # the end of the run, in the timelines' times
    note: str = ""  # what the page should say about what is missing, if anything

    def timeline(self, key: str) -> Timeline | None:
        return next((t for t in self.timelines if t.key == key), None)


def save(run: SavedRun) -> bytes:
    return msgspec.json.encode(run)


def load(data: bytes) -> SavedRun:
    return msgspec.json.decode(data, type=SavedRun)
