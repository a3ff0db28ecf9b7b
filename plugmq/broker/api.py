"""Module-level conveniences over every installed plugin: ``allocate`` and ``compile_filter``."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from plugmq.core.contracts import Filter
from plugmq.core.errors import FilterSyntaxError
from plugmq.core.message import MessageQueue
from plugmq.core.pluginmanager import installed_allocate_strategies, installed_filter_compilers

__all__ = ["allocate", "compile_filter"]


def compile_filter(expression_type: str, expression: str) -> Filter:
    """Compile ``expression`` with the installed filter plugin for ``expression_type``.

    Raises FilterSyntaxError for a bad expression or an expression type no plugin offers.
    """
    compilers = installed_filter_compilers()
    compiler = compilers.get(expression_type.upper())
    if compiler is None:
        close = difflib.get_close_matches(expression_type.upper(), list(compilers), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise FilterSyntaxError(
            f"no installed filter plugin handles expression type {expression_type!r}.{hint} "
            f"Installed types: {', '.join(sorted(compilers)) or 'none'}",
            expression=expression,
        )
    return compiler.compile(expression)


def allocate(
    strategy: str,
    current_id: str,
    queues: Sequence[MessageQueue],
    consumer_ids: Sequence[str],
    *,
    consumer_group: str = "",
    **params: Any,
) -> list[MessageQueue]:
    """The queues ``current_id`` gets from ``strategy`` (RocketMQ-identical), over installed plugins.

    Inputs are used as given: sort them with ``plugmq.core.rebalance_order.rocketmq_sorted`` the way
    a rebalance does.
    """
    from plugmq.broker.allocation_api import allocate_with

    return allocate_with(
        installed_allocate_strategies(), strategy, current_id, queues, consumer_ids,
        consumer_group=consumer_group, **params,
    )
