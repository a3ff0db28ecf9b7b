"""alloc: RocketMQ's queue-allocation strategies, giving RocketMQ's exact answers.

AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, MACHINE_ROOM_NEARBY, MACHINE_ROOM and CONFIG. Strategies
never sort their input: the caller sorts with ``plugmq.core.rebalance_order.rocketmq_sorted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from plugmq.core import AllocateStrategyFactory, Family, PluginDeclaration, hookimpl
from plugmq.plugins.alloc.registry import CAPABILITIES, STRATEGIES

__all__ = ["plugmq_allocate_strategies", "plugmq_declare"]


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="alloc",
        families={Family.ALLOCATION},
        description="RocketMQ's queue-allocation strategies: " + ", ".join(STRATEGIES),
        options=None,
        capabilities=MappingProxyType(dict(CAPABILITIES)),
    )


@hookimpl
def plugmq_allocate_strategies() -> Mapping[str, AllocateStrategyFactory]:
    return dict(STRATEGIES)
