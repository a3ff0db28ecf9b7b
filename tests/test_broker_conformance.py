"""The broker-level conformance suite over store x delay x filter combinations."""

from __future__ import annotations

import pytest

from plugmq.conformance.broker import BrokerConformance, BrokerUnderTest

_FILTERS = ("filter_tag", "filter_sql", "alloc")
# Every store, every delay strategy, and the filters: store x delay pairs cover each once.
COMBINATIONS = {
    "mmap-wheel": BrokerUnderTest(("store_mmap", "delay_wheel", *_FILTERS),
                                  {"store_mmap": {"commit_log_segment_size": 1 << 20}}),
    "lmdb-schedule": BrokerUnderTest(("store_lmdb", "delay_schedule", *_FILTERS)),
    "rocks-level": BrokerUnderTest(("store_rocks", "delay_level", *_FILTERS)),
    "lmdb-no-delay": BrokerUnderTest(("store_lmdb", "alloc")),
}


@pytest.fixture(params=sorted(COMBINATIONS))
def broker_plugins(request: pytest.FixtureRequest) -> BrokerUnderTest:
    return COMBINATIONS[request.param]


class TestBroker(BrokerConformance):
    pass
