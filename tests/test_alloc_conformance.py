"""The allocation conformance suite applied to each of the alloc plugin's six strategies."""

from __future__ import annotations

import functools

import pytest

import plugmq.plugins.alloc as alloc
from plugmq.conformance.allocation import AllocationConformance
from plugmq.core import MessageQueue

STRATEGIES = alloc.plugmq_allocate_strategies()
CAPABILITIES = alloc.plugmq_declare().capabilities


def _fixture(name: str, **params: object):
    return name, functools.partial(STRATEGIES[name], **params), CAPABILITIES[name]


class TestAvgConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("AVG")


class TestAvgByCircleConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("AVG_BY_CIRCLE")


class TestConsistentHashConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("CONSISTENT_HASH")


class TestConsistentHashFewNodesConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("CONSISTENT_HASH", virtual_nodes=1)


class TestMachineRoomNearbyConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("MACHINE_ROOM_NEARBY")


class TestMachineRoomNearbyCircleConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("MACHINE_ROOM_NEARBY", inner="AVG_BY_CIRCLE")


class TestMachineRoomConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("MACHINE_ROOM", rooms=["r0", "r1"])


class TestConfigConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("CONFIG", message_queues=[MessageQueue("T", "r0-b0", 0), MessageQueue("T", "r1@b1", 3)])

    def test_consumer_not_in_list_gets_nothing(self, allocation_strategy_factory) -> None:  # type: ignore[override]
        pytest.skip(
            "CONFIG does no input checks: like RocketMQ's AllocateMessageQueueByConfig it returns its "
            "configured list to any caller"
        )
