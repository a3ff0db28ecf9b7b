"""The conformance suite for installed plugins named with ``--plugmq-plugin NAME``.

Run as ``plugmq conformance --plugin NAME`` or ``pytest --pyargs plugmq.conformance --plugmq-plugin NAME``.
Each family's base class runs for every named plugin that declares that family; a family no named
plugin declares is left out (deselected and counted, see ``pytest_plugin``), not a pile of skips.
The broker clauses run for every named plugin: it is put in a working broker beside companion
plugins of the families it does not provide.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

import pytest

from plugmq.conformance.pytest_plugin import NOT_APPLICABLE, plugins_under_test
from plugmq.core.contracts import AllocationCapabilities, Family, PluginDeclaration
from plugmq.core.pluginmanager import installed_plugins, load_plugins

_COMPANIONS = {  # what a broker-level run adds around the plugin under test, first installed wins
    Family.STORAGE: ("store_mmap", "store_lmdb", "store_rocks"),
    Family.DELAY: ("delay_wheel", "delay_schedule", "delay_level"),
    Family.ALLOCATION: ("alloc",),
}


def _declaration(name: str) -> PluginDeclaration:
    return load_plugins([name], check_cardinality=False).declarations[name]


def _family_base(module: str, cls: str) -> type:
    try:
        return getattr(importlib.import_module(f"plugmq.conformance.{module}"), cls)
    except (ImportError, AttributeError) as exc:
        reason = f"the {module} conformance suite is not available: {exc}"

        class Missing:
            def test_family_suite_available(self) -> None:
                pytest.skip(reason)

        return Missing


def _params(config: pytest.Config, family: Family) -> list[Any]:
    names = plugins_under_test(config)
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason="name a plugin with --plugmq-plugin NAME"))]
    params = [pytest.param(name, id=name) for name in names if family in _declaration(name).families]
    if not params:  # deselected by the pytest plugin: not this plugin's family
        return [pytest.param(None, id=f"no-{family.value}-plugin", marks=getattr(pytest.mark, NOT_APPLICABLE)(family.value))]
    return params


def _keyed(config: pytest.Config, family: Family, hook: str) -> list[Any]:
    params = []
    for param in _params(config, family):
        name = param.values[0]
        if name is None:  # not applicable, or no plugin named
            params.append(param)
            continue
        loaded = load_plugins([name], check_cardinality=False)
        offered = getattr(loaded.hooks, hook)()
        params += [pytest.param((name, key, value), id=f"{name}:{key}") for key, value in sorted(offered.items())]
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "store_plugin" in metafunc.fixturenames:
        metafunc.parametrize("store_plugin", _params(config, Family.STORAGE), indirect=True)
    if "allocation_strategy_factory" in metafunc.fixturenames:
        metafunc.parametrize("allocation_strategy_factory",
                             _keyed(config, Family.ALLOCATION, "allocate_strategies"), indirect=True)
    if "filter_compiler" in metafunc.fixturenames:
        metafunc.parametrize("filter_compiler", _keyed(config, Family.FILTER, "filter_compilers"), indirect=True)
    if "txn_plugins" in metafunc.fixturenames:
        metafunc.parametrize("txn_plugins", _params(config, Family.TRANSACTION), indirect=True)
    if "delay_plugin" in metafunc.fixturenames:
        metafunc.parametrize("delay_plugin", _params(config, Family.DELAY), indirect=True)
    if "broker_plugins" in metafunc.fixturenames:
        params = []
        names: list[str | None] = [*plugins_under_test(config)] or [None]
        for name in names:
            if name is None:
                params.append(pytest.param(None, marks=pytest.mark.skip(reason="name a plugin with --plugmq-plugin NAME")))
                continue
            if Family.CLUSTER in _declaration(name).families:
                params.append(pytest.param(None, id=name, marks=pytest.mark.skip(
                    reason=f"{name} is a cluster plugin: the broker clauses run one broker without a name service "
                           "(the cluster family has no clauses yet; cluster_zk's own tests run it on a real ZooKeeper)")))
                continue
            params.append(pytest.param(name, id=name))
        metafunc.parametrize("broker_plugins", params, indirect=True)


@pytest.fixture
def store_plugin(request: pytest.FixtureRequest) -> Any:
    from plugmq.conformance.storage import StoreUnderTest, flip_newest_body

    # A format-blind corruption: works for stores keeping bodies verbatim; others fail it loudly.
    return StoreUnderTest(plugin=request.param, options={}, corrupt_tail=flip_newest_body(request.param, {}))


@pytest.fixture
def allocation_strategy_factory(request: pytest.FixtureRequest) -> Any:
    plugin, strategy, factory = request.param
    capabilities = _declaration(plugin).capabilities
    if isinstance(capabilities, Mapping):
        capabilities = capabilities.get(strategy)
    capabilities = capabilities or AllocationCapabilities()
    return strategy, functools.partial(factory, **capabilities.example_params), capabilities


@pytest.fixture
def filter_compiler(request: pytest.FixtureRequest) -> Any:
    return request.param[2]


@pytest.fixture
def delay_plugin(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture
def txn_plugins(request: pytest.FixtureRequest) -> tuple[str, ...]:
    usable = {p.name for p in installed_plugins() if p.error is None}
    # store_lmdb first: it reopens fastest, and the restart clauses reopen many times.
    store = next(s for s in ("store_lmdb", "store_mmap", "store_rocks") if s in usable)
    return (store, request.param, *[a for a in _COMPANIONS[Family.ALLOCATION] if a in usable])


@pytest.fixture
def broker_plugins(request: pytest.FixtureRequest) -> Any:
    from plugmq.conformance.broker import BrokerUnderTest

    name = request.param
    families = _declaration(name).families
    usable = {p.name for p in installed_plugins() if p.error is None}
    plugins = [name]
    for family, companions in _COMPANIONS.items():
        if family not in families:
            plugins += [c for c in companions if c in usable][:1]
    plugins += [f for f in ("filter_tag", "filter_sql") if f in usable and f != name and Family.FILTER not in families]
    return BrokerUnderTest(tuple(plugins))


class TestStorageContract(_family_base("storage", "StoreConformance")):  # type: ignore[misc]
    pass


class TestAllocationContract(_family_base("allocation", "AllocationConformance")):  # type: ignore[misc]
    pass


class TestFilterContract(_family_base("filters", "FilterConformance")):  # type: ignore[misc]
    pass


class TestDelayContract(_family_base("delay", "DelayConformance")):  # type: ignore[misc]
    pass


class TestTransactionContract(_family_base("transactions", "TransactionConformance")):  # type: ignore[misc]
    pass


class TestBrokerContract(_family_base("broker", "BrokerConformance")):  # type: ignore[misc]
    pass
