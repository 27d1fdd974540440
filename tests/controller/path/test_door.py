"""The door's own rules, apart from a running node."""

import asyncio

from scaler.controller.path.door import gave_up_why
from scaler.runtime.bus import Unavailable
from scaler.store.stream import NotSent, Rejected


def test_an_assign_given_up_for_a_store_that_did_not_take_it_says_so_whatever_kind():
    """The Cancel of an Assign whose caller stopped waiting says why. The store's refusals and unsent appends are
    kinds of Unavailable: looked up by their exact type they were told as a caller that disconnected."""
    for e in (Unavailable("away"), NotSent("past its lease"), Rejected("disk full")):
        assert gave_up_why(e) == "event store unavailable"
    assert gave_up_why(TimeoutError()) == "no answer in time"
    assert gave_up_why(asyncio.CancelledError()) == "caller disconnected"
