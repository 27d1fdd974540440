"""A function called in groups (`forecast.group_pause`, `forecast.in_group`), as read on each decision.

Both work on the points and gaps as they stand, with shortcuts (pauses found by index, only the points
within a burst spelled out); each must give what the plain reading gives: a walk through the gaps, and
every point spelled out and those past the burst dropped.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.controller.core.next_gap import spread
from scaler.controller.core.policy.forecast import (
    GROUP_PAUSES_ALIKE,
    GROUPS_FROM,
    NEVER,
    GroupPause,
    Points,
    group_pause,
    in_group,
)

# Groups of a few calls (short gaps), each with the pause after it, and the current group's calls so far:
# mostly of one size, so that enough groups of the current one's size came.
gaps_ = st.integers(0, 3).flatmap(
    lambda n: st.builds(
        lambda groups, current: tuple(g for m, pause in groups for g in (*[20] * m, pause)) + (7,) * current,
        st.lists(st.tuples(st.sampled_from([n, n, n, n + 1]), st.sampled_from([500, 520, 560, 900])), max_size=30),
        st.sampled_from([n, n, n + 1]),
    )
)


def walked(gaps: tuple[int, ...], burst: float) -> tuple[int, list[tuple[int, int]]]:
    """The current group's size, and each ended group's size with the pause after it, the first left out."""
    size, ended = 0, []
    for gap in gaps:
        if gap > burst:
            ended.append((size, gap))
            size = 0
        else:
            size += 1
    return size, ended[1:]


@settings(max_examples=300, deadline=None)
@given(gaps_, st.sampled_from([5, 50, 500, 1_000]))
def test_group_pause_reads_the_groups_a_walk_through_the_gaps_finds(gaps, burst):
    size, ended = walked(gaps, burst)
    reached = sum(1 for n, _ in ended if n >= size)
    pauses = sorted(gap for n, gap in ended if n == size)
    found = group_pause(gaps, burst)
    if len(pauses) < GROUPS_FROM or reached < GROUPS_FROM or pauses[-1] > GROUP_PAUSES_ALIKE * pauses[0]:
        assert found is None
    else:
        assert found == GroupPause(len(pauses) / reached, pauses)


point = st.tuples(st.sampled_from([1.0, 10.0, 100.0, 250.0, 900.0, 5_000.0]), st.floats(0.01, 5.0))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(point, min_size=1, max_size=40),
    st.booleans(),
    st.floats(0.0, 0.99),
    st.floats(0.0, 2_000.0),
    st.sampled_from([50.0, 250.0, 1_000.0]),
)
def test_in_group_spreads_the_points_within_a_burst_as_if_all_were_spelled_out(points, never, ended, elapsed, burst):
    given_points = Points.of(sorted(points) + ([(NEVER, 0.5)] if never else []))
    pauses = [600, 620, 640, 650, 700]
    found = in_group(given_points, ended, pauses, elapsed, burst)
    # the plain reading: every point apart, those past the burst dropped
    total = given_points.total
    later = [p * f for p in pauses for f in spread(pauses, 0, len(pauses)) if p * f > elapsed]
    if not later:
        assert found == given_points
        return
    within = [(x, w) for x, w in given_points.pairs() if x <= burst]
    share = sum(w for _, w in within)
    ended = ended if share else 1.0
    out = [(x, w * (1 - ended) * total / share) for x, w in within] if ended < 1 else []
    out += [(x, ended * total / len(later)) for x in later]
    assert found == Points.of(sorted(out))
