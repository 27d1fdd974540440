"""The whole-decision helper (tests/controller/core/given.py) fails on any part that differs, and says which."""

import pytest

from scaler.controller.core.features import UNKNOWN_START_MS
from scaler.proto import events as e
from tests.controller.core.factories import META, assign
from tests.controller.core.given import given

COLD = "cold start: no idle instance"
ARRIVED = [
    e.FunctionSeen(at_ms=0, meta=META),
    e.RequestArrived(at_ms=0, request_id="r1", reply_to="to-r1"),
    e.SlotWanted(at_ms=0, instance_id="fn-1", meta=META, for_request="r1", reason=COLD),
]


def test_the_whole_decision_is_returned_when_it_is_the_one_stated():
    wake = UNKNOWN_START_MS + 30_000
    d = given().when(assign("r1"), at=0).then(events=ARRIVED, wake_ms=wake)
    assert d.events == ARRIVED and d.replies == [] and d.wake_ms == wake and "fn-1" in d.state.instances


def test_an_event_that_differs_is_shown_as_a_diff_of_that_line():
    other = [*ARRIVED[:2], e.SlotWanted(at_ms=0, instance_id="fn-2", meta=META, for_request="r1", reason=COLD)]
    with pytest.raises(AssertionError) as failed:
        given().when(assign("r1"), at=0).then(events=other, wake_ms=UNKNOWN_START_MS + 30_000)
    lines = str(failed.value).splitlines()
    assert [line.split(", meta=")[0] for line in lines if line.startswith(("-  ", "+  "))] == [
        "-  SlotWanted(instance_id='fn-2'",
        "+  SlotWanted(instance_id='fn-1'",
    ]


def test_replies_and_the_wake_up_are_compared_too():
    with pytest.raises(AssertionError, match=r"(?s)-wake_ms: None\n\+wake_ms: 31000"):
        given().when(assign("r1"), at=0).then(events=ARRIVED)
    with pytest.raises(AssertionError, match=r"\n-  <object object at"):
        given().when(assign("r1"), at=0).then(events=ARRIVED, replies=[object()], wake_ms=UNKNOWN_START_MS + 30_000)
