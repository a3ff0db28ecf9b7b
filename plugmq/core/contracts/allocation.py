"""Allocation family: queue-allocation strategies, keyed by name (``plugmq_allocate_strategies``).

Any number per broker. A strategy (:class:`AllocateStrategy`) answers which queues one consumer of
a group takes; every member computes it over the same sorted lists and reaches the same answer.
A plugin declares :class:`AllocationCapabilities` per strategy name (a mapping in its declaration).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.message import (
    MessageQueue,
)

__all__ = ["AllocateStrategy", "AllocateStrategyFactory", "AllocationCapabilities"]


@attrs.frozen
class AllocationCapabilities:
    """``may_leave_queues_unassigned``: the union over consumers need not cover every queue.

    ``example_params``: keyword parameters that make a working strategy for the conformance
    suite when the strategy needs configuration (e.g. MACHINE_ROOM's ``rooms``).
    """

    may_leave_queues_unassigned: bool = False
    example_params: Mapping[str, Any] = attrs.field(factory=dict)
    # The factory takes ``broker_room`` (broker name -> room) and ``consumer_room`` (consumer id
    # -> room) resolvers, each returning None for "no room"; a broker passes its cluster's rooms.
    room_aware: bool = False


@runtime_checkable
class AllocateStrategy(Protocol):
    """RocketMQ's AllocateMessageQueueStrategy: which queues one consumer of a group takes.

    The rules ``plugmq.conformance.allocation`` checks (clause names in brackets), for inputs
    of distinct queues and distinct consumer ids sorted as the rebalance sorts them, with the
    ``example_params`` the plugin declares for the strategy:

    - Every queue goes to exactly one consumer: the consumers' answers, each computed with the
      consumer's own id over the same lists, are disjoint and cover every queue — unless the
      declared capabilities say ``may_leave_queues_unassigned`` (then disjoint only)
      [every_queue_assigned_exactly_once].
    - Everyone computes the same assignment: members that learned queues and ids in any order
      and sorted them (``rocketmq_sorted``) get the same answers from fresh strategy instances
      [all_consumers_compute_the_same_assignment].
    - Deterministic and pure: the same instance and a fresh one answer the same for the same
      input; the input lists are not modified (never sort or edit them)
      [deterministic_and_leaves_input_alone].
    - More consumers than queues: answers are lists of MessageQueue; every queue still assigned
      once and at least ``consumers - queues`` consumers idle (unless it may leave queues
      unassigned) [more_consumers_than_queues].
    - A consumer id not in the list gets ``[]`` [consumer_not_in_list_gets_nothing].
    """

    @property
    def name(self) -> str:
        """The strategy name; equal to the key of ``plugmq_allocate_strategies``."""

    @property
    def capabilities(self) -> AllocationCapabilities:
        """What the union of the consumers' answers covers (the suite reads the capabilities the
        plugin declares for this strategy name)."""

    def allocate(self, consumer_group: str, current_id: str, all_queues: Sequence[MessageQueue],
                 all_consumer_ids: Sequence[str]) -> list[MessageQueue]:
        """The current consumer's queues. Inputs arrive sorted by the caller; never sort here."""


AllocateStrategyFactory = Callable[..., AllocateStrategy]
"""Builds a strategy from its keyword parameters (e.g. ``virtual_nodes=10``)."""
