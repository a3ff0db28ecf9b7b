"""The broker-level conformance suite over store x delay x filter combinations."""

from __future__ import annotations

import pytest

from plugmq.conformance.broker import BrokerConformance, BrokerUnderTest

COMBINATIONS = {
    "lmdb-wheel": BrokerUnderTest(("store_lmdb", "delay_wheel", "alloc")),
}


@pytest.fixture(params=sorted(COMBINATIONS))
def broker_plugins(request: pytest.FixtureRequest) -> BrokerUnderTest:
    return COMBINATIONS[request.param]


class TestBroker(BrokerConformance):
    pass
