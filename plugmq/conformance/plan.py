"""What a conformance run puts under test for the plugins named with ``--plugmq-plugin``.

Each family's clauses run for every named plugin that declares the family (keyed families: for
every expression type or strategy it offers). The broker clauses run every named plugin inside a
working broker (:func:`compose_broker`): the plugin, the other named plugins that fit beside it,
and installed companions for the families still missing. The consumers of the broker clauses use
an allocation strategy of the plugin under test when it offers any, so a third-party allocation
plugin is judged by its own strategies, never by a built-in one it may not have.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from plugmq.conformance.broker import BrokerUnderTest
from plugmq.core.contracts import AllocationCapabilities, Family, PluginDeclaration
from plugmq.core.pluginmanager import installed_plugins, load_plugins

__all__ = [
    "COMPANIONS",
    "broker_strategy",
    "compose_broker",
    "declaration",
    "keyed_offers",
    "strategy_capabilities",
    "usable_plugins",
]

#: What a broker-level run adds for a family none of its plugins provides, first installed first.
COMPANIONS: Mapping[Family, tuple[str, ...]] = {
    Family.STORAGE: ("store_mmap", "store_lmdb", "store_rocks"),
    Family.DELAY: ("delay_wheel", "delay_schedule", "delay_level"),
    Family.ALLOCATION: ("alloc",),
    Family.FILTER: ("filter_tag", "filter_sql"),  # all that fit: the filter clauses pull with each
}
_ONE_PER_BROKER = frozenset({Family.STORAGE, Family.DELAY, Family.TRANSACTION, Family.CLUSTER, Family.REPLICATION})
# A broker of the broker clauses runs alone, as a master: no name service, no slaves.
_NOT_IN_A_SINGLE_BROKER = frozenset({Family.CLUSTER, Family.REPLICATION})


@functools.cache
def declaration(name: str) -> PluginDeclaration:
    """The installed plugin's declaration (loaded once per run)."""
    return load_plugins([name], check_cardinality=False).declarations[name]


@functools.cache
def keyed_offers(name: str, family: Family) -> Mapping[str, Any]:
    """What the plugin offers under keys: strategy factories (allocation) or compilers (filter)."""
    hooks = load_plugins([name], check_cardinality=False).hooks
    if family is Family.ALLOCATION:
        return hooks.allocate_strategies()
    if family is Family.FILTER:
        return hooks.filter_compilers()
    raise ValueError(f"{family.value} is not a keyed family")


def strategy_capabilities(name: str, strategy: str) -> AllocationCapabilities:
    """The capabilities the plugin declares for ``strategy`` (one value, or a mapping by name)."""
    declared = declaration(name).capabilities
    if isinstance(declared, Mapping):
        declared = declared.get(strategy)
    return declared if isinstance(declared, AllocationCapabilities) else AllocationCapabilities()


@functools.cache
def usable_plugins() -> frozenset[str]:
    """Installed plugins that load and declare themselves."""
    return frozenset(p.name for p in installed_plugins() if p.error is None)


def _keys(plugins: Sequence[str], family: Family) -> set[str]:
    return {key for p in plugins if family in declaration(p).families for key in keyed_offers(p, family)}


def _fits(candidate: str, plugins: Sequence[str]) -> bool:
    """Whether ``candidate`` can join ``plugins`` in one broker (cardinality, keys, a single broker)."""
    families = declaration(candidate).families
    if families & _NOT_IN_A_SINGLE_BROKER:
        return False
    taken = {family for p in plugins for family in declaration(p).families}
    if families & taken & _ONE_PER_BROKER:
        return False
    return not any(family in families and set(keyed_offers(candidate, family)) & _keys(plugins, family)
                   for family in (Family.ALLOCATION, Family.FILTER))


def broker_strategy(name: str, plugins: Sequence[str]) -> tuple[str, Mapping[str, Any], AllocationCapabilities] | None:
    """The allocation strategy the broker clauses' consumers use: one of ``name``'s own when it is
    an allocation plugin, else one of the composition's (AVG when offered). A strategy that
    assigns every queue goes first, then one that needs no rooms. None: nothing offers one."""
    owners = [name] if Family.ALLOCATION in declaration(name).families else [
        p for p in plugins if Family.ALLOCATION in declaration(p).families]
    ranked = []
    for owner in owners:
        for strategy in keyed_offers(owner, Family.ALLOCATION):
            capabilities = strategy_capabilities(owner, strategy)
            rank = (capabilities.may_leave_queues_unassigned, capabilities.room_aware, strategy != "AVG", strategy)
            ranked.append((rank, strategy, capabilities))
    if not ranked:
        return None
    _, strategy, capabilities = min(ranked, key=lambda item: item[0])
    return strategy, capabilities.example_params, capabilities


def compose_broker(name: str, named: Sequence[str]) -> BrokerUnderTest:
    """The broker the broker clauses run ``name`` in: ``name``, every other named plugin that fits
    beside it, and companions for the families still missing."""
    plugins = [name]
    for other in named:
        if other not in plugins and _fits(other, plugins):
            plugins.append(other)
    usable = usable_plugins()
    for family, companions in COMPANIONS.items():
        provided = any(family in declaration(p).families for p in plugins)
        for companion in companions:
            if provided and family is not Family.FILTER:
                break
            if companion in usable and companion not in plugins and _fits(companion, plugins):
                plugins.append(companion)
                provided = True
    chosen = broker_strategy(name, plugins)
    if chosen is None:
        return BrokerUnderTest(tuple(plugins), strategy=None)
    strategy, params, capabilities = chosen
    return BrokerUnderTest(tuple(plugins), strategy=strategy, strategy_params=params,
                           strategy_covers_every_queue=not capabilities.may_leave_queues_unassigned)
