"""Conformance clauses of the allocation family, for any allocation strategy.

Subclass :class:`AllocationConformance` and provide one fixture, ``allocation_strategy_factory``,
returning ``(name, factory, capabilities)``: ``factory()`` (no arguments: bind parameters with
``functools.partial``) builds the strategy under test. Inputs are random and sorted the way the
rebalance sorts them (:func:`plugmq.core.rebalance_order.rocketmq_sorted`), because a strategy is
only required to agree with its peers on sorted input. A clause a strategy's capabilities excuse
is reported as a skip with the reason.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from plugmq.conformance.budget import examples
from plugmq.core import AllocateStrategy, AllocationCapabilities, MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["AllocationConformance", "allocation_inputs", "global_assignment"]

StrategyFixture = tuple[str, Callable[[], AllocateStrategy], AllocationCapabilities]

# Broker names in two shapes: "room-broker" (what a room resolver splitting on "-" expects) and
# "room@broker" (what a "@"-split room strategy expects), so room-aware strategies get real work.
_brokers = st.builds(
    lambda room, sep, n: f"r{room}{sep}b{n}", st.integers(0, 3), st.sampled_from(["-", "@"]), st.integers(0, 4)
)
_queues = st.builds(MessageQueue, st.sampled_from(["T", "TopicB"]), _brokers, st.integers(0, 15))
_consumer_ids = st.builds(
    lambda room, host, pid: f"r{room}-10.0.0.{host}@{pid}", st.integers(0, 4), st.integers(0, 255), st.integers(1, 9)
)

_settings = settings(
    max_examples=examples(60),
    deadline=None,
    # Failures are shrunk to a minimal input; the "explain" phase is left out: it re-runs a
    # failing clause thousands of times for little extra insight on inputs this small.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    # The fixture only hands out a factory (each example builds its own strategy), and every
    # subclass runs the same test function: neither check applies to this suite.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


@st.composite
def allocation_inputs(
    draw: st.DrawFn, *, max_queues: int = 40, max_consumers: int = 12, more_consumers: bool = False
) -> tuple[list[MessageQueue], list[str]]:
    """Distinct queues and distinct consumer ids, sorted as the rebalance sorts them."""
    queues = draw(st.lists(_queues, min_size=1, max_size=max_queues, unique=True))
    if more_consumers:
        ids = draw(st.lists(_consumer_ids, min_size=len(queues) + 1, max_size=len(queues) + 8, unique=True))
    else:
        ids = draw(st.lists(_consumer_ids, min_size=1, max_size=max_consumers, unique=True))
    return rocketmq_sorted(queues, ids)


def global_assignment(
    strategy: AllocateStrategy, queues: list[MessageQueue], ids: list[str], group: str = "conformance_group"
) -> dict[str, list[MessageQueue]]:
    """Every consumer's share, each computed as that consumer computes it (its own id, same lists)."""
    return {cid: strategy.allocate(group, cid, list(queues), list(ids)) for cid in ids}


class AllocationConformance:
    """The allocation contract. Needs the fixture ``allocation_strategy_factory``."""

    @given(inputs=allocation_inputs())
    @_settings
    def test_every_queue_assigned_exactly_once(
        self, allocation_strategy_factory: StrategyFixture, inputs: tuple[list[MessageQueue], list[str]]
    ) -> None:
        """The consumers' answers, each computed with its own id over the same lists, are disjoint and
        cover every queue."""
        name, factory, capabilities = allocation_strategy_factory
        if capabilities.may_leave_queues_unassigned:
            pytest.skip(f"{name} declares may_leave_queues_unassigned: its union need not cover every queue")
        queues, ids = inputs
        assignment = global_assignment(factory(), queues, ids)
        counts = Counter(q for share in assignment.values() for q in share)
        assert set(counts) == set(queues), f"{name}: queues missing or foreign: {set(queues) ^ set(counts)}"
        twice = [q for q, n in counts.items() if n > 1]
        assert not twice, f"{name}: queues given to more than one consumer: {twice}"

    @given(inputs=allocation_inputs(), data=st.data())
    @_settings
    def test_all_consumers_compute_the_same_assignment(
        self,
        allocation_strategy_factory: StrategyFixture,
        inputs: tuple[list[MessageQueue], list[str]],
        data: st.DataObject,
    ) -> None:
        """Each member learns the queues and members in its own order, sorts them as the
        rebalance does, and works out everyone's share with its own strategy instance."""
        name, factory, _ = allocation_strategy_factory
        queues, ids = inputs
        reference = global_assignment(factory(), queues, ids)
        for _member in ids:
            seed = data.draw(st.integers(0, 2**32 - 1), label="member view shuffle seed")
            shuffler = random.Random(seed)
            seen_queues, seen_ids = list(queues), list(ids)
            shuffler.shuffle(seen_queues)
            shuffler.shuffle(seen_ids)
            sorted_queues, sorted_ids = rocketmq_sorted(seen_queues, seen_ids)
            assert global_assignment(factory(), sorted_queues, sorted_ids) == reference, (
                f"{name}: a member that saw the inputs in another order computed another assignment"
            )

    @given(inputs=allocation_inputs())
    @_settings
    def test_deterministic_and_leaves_input_alone(
        self, allocation_strategy_factory: StrategyFixture, inputs: tuple[list[MessageQueue], list[str]]
    ) -> None:
        """The same instance and a fresh one answer the same for the same input, and the input lists are
        left unchanged."""
        name, factory, _ = allocation_strategy_factory
        queues, ids = inputs
        strategy = factory()
        queues_before, ids_before = list(queues), list(ids)
        first = {cid: strategy.allocate("g", cid, queues, ids) for cid in ids}
        assert queues == queues_before and ids == ids_before, (
            f"{name} modified the lists it was given (strategies must not sort or edit their input)"
        )
        again = {cid: strategy.allocate("g", cid, queues, ids) for cid in ids}
        fresh = global_assignment(factory(), queues, ids, group="g")
        assert first == again == fresh, f"{name} gave different answers for the same input"

    @given(inputs=allocation_inputs(max_queues=6, more_consumers=True))
    @_settings
    def test_more_consumers_than_queues(
        self, allocation_strategy_factory: StrategyFixture, inputs: tuple[list[MessageQueue], list[str]]
    ) -> None:
        """With more consumers than queues the answers are lists of queues, every queue is assigned once
        and the extra consumers stay idle."""
        name, factory, capabilities = allocation_strategy_factory
        queues, ids = inputs
        assignment = global_assignment(factory(), queues, ids)
        for share in assignment.values():
            assert isinstance(share, list) and all(isinstance(q, MessageQueue) for q in share)
        if capabilities.may_leave_queues_unassigned:
            return  # answering without error is all such a strategy owes here
        assigned = [q for share in assignment.values() for q in share]
        assert sorted(assigned) == sorted(queues), f"{name}: not every queue assigned exactly once"
        idle = sum(1 for share in assignment.values() if not share)
        assert idle >= len(ids) - len(queues), f"{name}: more consumers busy than there are queues"

    @given(inputs=allocation_inputs())
    @_settings
    def test_consumer_not_in_list_gets_nothing(
        self, allocation_strategy_factory: StrategyFixture, inputs: tuple[list[MessageQueue], list[str]]
    ) -> None:
        """A consumer id that is not in the consumer list gets no queue."""
        name, factory, _ = allocation_strategy_factory
        queues, ids = inputs
        outsider = "outsider-192.168.255.255@0"
        assert outsider not in ids
        assert factory().allocate("g", outsider, queues, ids) == [], (
            f"{name} gave queues to a consumer that is not in the consumer list"
        )

    def test_long_lived_instances_follow_membership_changes(self, allocation_strategy_factory: StrategyFixture) -> None:
        """Consumers that keep one strategy instance while members join and leave and queues come and
        go answer as fresh instances do, and (unless it may leave queues unassigned) together still
        assign every queue exactly once."""
        name, factory, capabilities = allocation_strategy_factory
        run_state_machine_as_test(_membership_machine(name, factory, capabilities), settings=settings(
            max_examples=examples(25), stateful_step_count=12, deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]))


def _membership_machine(name: str, factory: Callable[[], AllocateStrategy],
                        capabilities: AllocationCapabilities) -> type[RuleBasedStateMachine]:
    """The reference model: the sets of queues and members. Each member keeps its strategy instance."""

    class Membership(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.queues: set[MessageQueue] = set()
            self.members: dict[str, AllocateStrategy] = {}

        @initialize(queues=st.lists(_queues, min_size=1, max_size=16, unique=True),
                     ids=st.lists(_consumer_ids, min_size=1, max_size=5, unique=True))
        def start(self, queues: list[MessageQueue], ids: list[str]) -> None:
            self.queues = set(queues)
            self.members = {cid: factory() for cid in ids}

        @rule(cid=_consumer_ids)
        def join(self, cid: str) -> None:
            self.members.setdefault(cid, factory())

        @precondition(lambda self: len(self.members) > 1)
        @rule(data=st.data())
        def leave(self, data: st.DataObject) -> None:
            del self.members[data.draw(st.sampled_from(sorted(self.members)), label="leaving")]

        @rule(queue=_queues)
        def add_queue(self, queue: MessageQueue) -> None:
            self.queues.add(queue)

        @precondition(lambda self: len(self.queues) > 1)
        @rule(data=st.data())
        def remove_queue(self, data: st.DataObject) -> None:
            self.queues.discard(data.draw(st.sampled_from(sorted(self.queues)), label="removed queue"))

        @invariant()
        def answers_match_fresh_instances_and_cover_the_queues(self) -> None:
            if not self.members:
                return
            queues, ids = rocketmq_sorted(list(self.queues), list(self.members))
            kept = {cid: self.members[cid].allocate("g", cid, list(queues), list(ids)) for cid in ids}
            fresh = global_assignment(factory(), queues, ids, group="g")
            assert kept == fresh, f"{name}: an instance kept across membership changes answered {kept}, a fresh one {fresh}"
            if capabilities.may_leave_queues_unassigned:
                return  # as in every_queue_assigned_exactly_once: such a strategy owes no coverage here
            counts = Counter(q for share in kept.values() for q in share)
            twice = [q for q, n in counts.items() if n > 1]
            assert not twice, f"{name}: queues given to more than one consumer: {twice}"
            assert set(counts) == set(queues), f"{name}: queues missing or foreign: {set(queues) ^ set(counts)}"

    return Membership
