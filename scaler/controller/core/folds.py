"""A function's two folds, together: its lifecycle (state.py) and its features (features.py).

What folds a whole function (the ledger, the core's drafts, tests) folds an event into both here; the
lifecycle comes first, and the features read it before and after.
"""

import functools
from collections.abc import Iterable

from scaler.controller.core import features, state
from scaler.controller.core.features import FnStats
from scaler.controller.core.state import FnState
from scaler.proto.events import Event

Folded = tuple[FnState, FnStats]


def apply(folded: Folded, e: Event) -> Folded:
    s, st = folded
    after = state.apply(s, e)
    return after, features.fold(st, e, s, after)


def replay(s: FnState, st: FnStats, events: Iterable[Event]) -> Folded:
    return functools.reduce(apply, events, (s, st))
