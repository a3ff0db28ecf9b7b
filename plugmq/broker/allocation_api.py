"""``plugmq.allocate``: run one allocation strategy by name, as a consumer of the group would."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from plugmq.core.contracts import AllocateStrategyFactory
from plugmq.core.errors import AllocationError
from plugmq.core.message import MessageQueue

__all__ = ["allocate_with", "unknown_strategy_error"]


def unknown_strategy_error(strategy: str, known: Iterable[str]) -> AllocationError:
    """The error for a strategy name no installed plugin offers, with a close match if any."""
    names = sorted(known)
    close = difflib.get_close_matches(strategy, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(names) if names else "none (no allocation plugin is installed)"
    return AllocationError(f"unknown allocation strategy {strategy!r}.{hint} Known strategies: {listed}")


def allocate_with(
    strategies: Mapping[str, AllocateStrategyFactory],
    strategy: str,
    current_id: str,
    queues: Iterable[MessageQueue],
    consumer_ids: Iterable[str],
    *,
    consumer_group: str = "",
    **params: Any,
) -> list[MessageQueue]:
    """The queues ``current_id`` gets from ``strategy`` (built with ``params``) for these inputs.

    The inputs are passed as given, like RocketMQ's strategy call: to get what a rebalance would
    give, sort them first with :func:`plugmq.core.rebalance_order.rocketmq_sorted`. Raises
    AllocationError for an unknown strategy or parameter, and for the strategy's input checks.
    """
    factory = strategies.get(strategy)
    if factory is None:
        raise unknown_strategy_error(strategy, strategies)
    return factory(**params).allocate(consumer_group, current_id, list(queues), list(consumer_ids))
