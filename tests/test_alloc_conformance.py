"""The allocation conformance suite applied to each of the alloc plugin's six strategies."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from hypothesis import Phase, settings

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
        # The declared example parameters, which the `plugmq conformance` runner uses too.
        return _fixture("MACHINE_ROOM", **CAPABILITIES["MACHINE_ROOM"].example_params)


class TestConfigConformance(AllocationConformance):
    @pytest.fixture
    def allocation_strategy_factory(self):
        return _fixture("CONFIG", message_queues=[MessageQueue("T", "r0-b0", 0), MessageQueue("T", "r1@b1", 3)])

    def test_consumer_not_in_list_gets_nothing(self, allocation_strategy_factory) -> None:
        pytest.skip(
            "CONFIG does no input checks: like RocketMQ's AllocateMessageQueueByConfig it returns its "
            "configured list to any caller"
        )


# ----------------------------------------------------------------------------------------------
# The clauses catch broken strategies (so a passing subclass above means something).
# ----------------------------------------------------------------------------------------------


class _Broken:
    name = "BROKEN"
    instances = 0

    def __init__(self, how: str) -> None:
        _Broken.instances += 1
        self.serial = _Broken.instances
        self.how = how
        self.capabilities = CAPABILITIES["AVG"]
        self.calls = 0

    def allocate(self, consumer_group, current_id, all_queues, all_consumer_ids):
        self.calls += 1
        if self.how == "everyone_gets_all":
            return list(all_queues)
        if self.how == "per_instance":
            # Depends on which object answers: members disagree.
            return list(all_queues) if current_id == all_consumer_ids[self.serial % len(all_consumer_ids)] else []
        if self.how == "changes_over_time":
            return list(all_queues) if self.calls % 2 and current_id == all_consumer_ids[0] else []
        if self.how == "sorts_input":
            all_queues.sort(reverse=True)
            return list(all_queues) if current_id == all_consumer_ids[0] else []
        if self.how == "feeds_outsiders":
            return list(all_queues) if current_id not in all_consumer_ids[1:] else []
        if self.how == "remembers_first_members":
            # Caches the member list of its first call: right until the group changes.
            self.first_members = getattr(self, "first_members", None) or list(all_consumer_ids)
            members = [cid for cid in self.first_members if cid in all_consumer_ids] or list(all_consumer_ids)
            mine = members.index(current_id) if current_id in members else None
            return [q for i, q in enumerate(all_queues) if mine is not None and i % len(members) == mine]
        raise AssertionError(self.how)


@pytest.fixture
def without_shrinking() -> Iterator[None]:
    """Only the clause's failure matters here: shrinking the failing example afterwards (up to half a
    minute for the stateful clause, which builds its settings as it runs, from the loaded profile)
    proves nothing more. The settings before are loaded again after."""
    before = settings()
    settings.register_profile("plugmq-tests-no-shrink", before,
                              phases=[phase for phase in before.phases if phase is not Phase.shrink])
    settings.load_profile("plugmq-tests-no-shrink")
    try:
        yield
    finally:
        settings.register_profile("plugmq-tests-restored", before)
        settings.load_profile("plugmq-tests-restored")


@pytest.mark.parametrize(
    ("how", "clause"),
    [
        ("everyone_gets_all", "test_every_queue_assigned_exactly_once"),
        ("everyone_gets_all", "test_more_consumers_than_queues"),
        ("per_instance", "test_all_consumers_compute_the_same_assignment"),
        ("changes_over_time", "test_deterministic_and_leaves_input_alone"),
        ("sorts_input", "test_deterministic_and_leaves_input_alone"),
        ("feeds_outsiders", "test_consumer_not_in_list_gets_nothing"),
        ("remembers_first_members", "test_long_lived_instances_follow_membership_changes"),
    ],
)
@pytest.mark.usefixtures("without_shrinking")
def test_clause_fails_for_a_broken_strategy(how: str, clause: str) -> None:
    fixture = ("BROKEN", lambda: _Broken(how), CAPABILITIES["AVG"])
    with pytest.raises(AssertionError):
        getattr(AllocationConformance(), clause)(allocation_strategy_factory=fixture)
