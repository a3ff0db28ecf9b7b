"""The delay conformance suite applied to the three built-in delay strategies."""

from __future__ import annotations

import pytest

from plugmq.conformance.delay import DelayConformance


@pytest.fixture(params=["delay_level", "delay_wheel", "delay_schedule"])
def delay_plugin(request: pytest.FixtureRequest) -> str:
    return request.param


class TestDelayStrategies(DelayConformance):
    # store_lmdb first: these runs judge the delay strategies, and its open/recover is quick
    # (store_mmap has its own conformance run).
    store_plugins = ("store_lmdb", "store_rocks", "store_mmap")
