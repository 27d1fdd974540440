"""The clairvoyant bound on a trace small enough to work out by hand."""

import pytest

from scaler.simulator.bound import clairvoyant_bound
from scaler.simulator.dataset import Dataset, FunctionMeta, Request


def test_bound_on_a_hand_made_trace():
    # a: 1 GB, warming up costs 100 + 400 = 500 ms; b: 2 GB, 100 + 900 = 1000 ms.
    metas = {
        "a": FunctionMeta(key="a", memory_in_mb=1024, init_duration_in_ms=400),
        "b": FunctionMeta(key="b", memory_in_mb=2048, init_duration_in_ms=900),
    }
    requests = [
        Request(0, "a", 100),  # new a1: 500
        Request(0, "b", 1000),  # new b1: 2 GB x 1000 = 2000
        Request(50, "a", 100),  # a1 busy: new a2: 500
        Request(200, "a", 100),  # a1 free since 100, a2 since 150: MRU a2, gap 50
        Request(1000, "b", 500),  # b1 free since 1000: gap 0
        Request(1300, "a", 100, status_code=500),  # MRU a2 (since 300), gap 1000 -> 500; then destroyed
        Request(1500, "a", 100),  # a2 is gone: a1 (since 100), gap 1400 -> 500
    ]
    bound = clairvoyant_bound(Dataset("hand", metas, requests))
    assert bound.instances == 3
    # executions: a 5 x 100 ms x 1 GB, b 1000 + 500 ms x 2 GB
    assert bound.execution_gb_s == pytest.approx(0.5 + 3.0)
    assert bound.idle_gb_s == pytest.approx((500 + 2000 + 500 + 50 + 0 + 500 + 500) / 1000)
    assert bound.resource_usage_score == pytest.approx(50 * 3.5 / 7.55)
    assert bound.score == pytest.approx(50 + 50 * 3.5 / 7.55)


def test_bound_of_a_single_request_is_its_warm_up():
    metas = {"f": FunctionMeta(key="f", memory_in_mb=512, init_duration_in_ms=100)}
    bound = clairvoyant_bound(Dataset("one", metas, [Request(7, "f", 200)]), create_latency_ms=100)
    assert (bound.instances, bound.execution_gb_s, bound.idle_gb_s) == (1, 0.1, 0.1)
    assert bound.score == pytest.approx(75)
