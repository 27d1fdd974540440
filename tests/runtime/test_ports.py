"""Ports drawn for processes to bind later."""

from scaler.runtime.ports import free_port


def test_ports_drawn_before_any_is_bound_are_all_different():
    """A cluster's servers, compose's services: each gets its port before any binds one. Drawn at random from
    12,000, 300 of them would meet by chance (the stub and a node's metrics once did, and the node could not
    listen)."""
    drawn = [free_port() for _ in range(300)]
    assert len(set(drawn)) == len(drawn)
