"""The conformance suite for installed plugins named with ``--plugmq-plugin NAME``.

Run as ``plugmq conformance --plugin NAME`` or ``pytest --pyargs plugmq.conformance --plugmq-plugin NAME``.
Each family's base class runs for every named plugin that declares that family; a family no named
plugin declares is left out (deselected and counted, see ``pytest_plugin``), not a pile of skips.
The broker clauses run for every named plugin: it is put in a working broker beside the other
named plugins that fit and companion plugins of the families still missing (``plan``).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from plugmq.conformance import plan
from plugmq.conformance.allocation import AllocationConformance
from plugmq.conformance.broker import BrokerConformance
from plugmq.conformance.delay import DelayConformance
from plugmq.conformance.filters import FilterConformance
from plugmq.conformance.pytest_plugin import plugins_under_test
from plugmq.conformance.storage import StoreConformance, StoreUnderTest, flip_newest_body
from plugmq.conformance.transactions import TransactionConformance
from plugmq.core.contracts import Family

_NAME_ONE = "name a plugin with --plugmq-plugin NAME"


def _params(config: pytest.Config, family: Family) -> list[Any]:
    names = plugins_under_test(config)
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason=_NAME_ONE))]
    params = [pytest.param(name, id=name) for name in names if family in plan.declaration(name).families]
    if not params:  # deselected by the pytest plugin: not this plugin's family
        return [pytest.param(None, id=f"no-{family.value}-plugin", marks=pytest.mark.plugmq_not_applicable(family.value))]
    return params


def _keyed(config: pytest.Config, family: Family) -> list[Any]:
    params = []
    for param in _params(config, family):
        name = param.values[0]
        if name is None:  # not applicable, or no plugin named
            params.append(param)
            continue
        offered = plan.keyed_offers(name, family)
        params += [pytest.param((name, key, value), id=f"{name}:{key}") for key, value in sorted(offered.items())]
    return params


def _broker_params(config: pytest.Config) -> list[Any]:
    names = plugins_under_test(config)
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason=_NAME_ONE))]
    params = []
    for name in names:
        if Family.CLUSTER in plan.declaration(name).families:
            params.append(pytest.param(None, id=name, marks=pytest.mark.skip(
                reason=f"{name} is a cluster plugin: the broker clauses run one broker without a name service "
                       "(the cluster family has no clauses yet; cluster_zk's own tests run it on a real ZooKeeper)")))
        else:
            params.append(pytest.param(plan.compose_broker(name, names), id=name))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    plain = {"store_plugin": Family.STORAGE, "txn_plugins": Family.TRANSACTION, "delay_plugin": Family.DELAY}
    for fixture, family in plain.items():
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, _params(config, family), indirect=True)
    keyed = {"allocation_strategy_factory": Family.ALLOCATION, "filter_compiler": Family.FILTER}
    for fixture, family in keyed.items():
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, _keyed(config, family), indirect=True)
    if "broker_plugins" in metafunc.fixturenames:
        metafunc.parametrize("broker_plugins", _broker_params(config))


@pytest.fixture
def store_plugin(request: pytest.FixtureRequest) -> Any:
    # A format-blind corruption: works for stores keeping bodies verbatim; others fail it loudly.
    return StoreUnderTest(plugin=request.param, options={}, corrupt_tail=flip_newest_body(request.param, {}))


@pytest.fixture
def allocation_strategy_factory(request: pytest.FixtureRequest) -> Any:
    plugin, strategy, factory = request.param
    capabilities = plan.strategy_capabilities(plugin, strategy)
    return strategy, functools.partial(factory, **capabilities.example_params), capabilities


@pytest.fixture
def filter_compiler(request: pytest.FixtureRequest) -> Any:
    return request.param[2]


@pytest.fixture
def delay_plugin(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture
def txn_plugins(request: pytest.FixtureRequest) -> tuple[str, ...]:
    usable = plan.usable_plugins()
    # store_lmdb first: it reopens fastest, and the restart clauses reopen many times.
    store = next(s for s in ("store_lmdb", "store_mmap", "store_rocks") if s in usable)
    return (store, request.param, *[a for a in plan.COMPANIONS[Family.ALLOCATION] if a in usable])


class TestStorageContract(StoreConformance):
    pass


class TestAllocationContract(AllocationConformance):
    pass


class TestFilterContract(FilterConformance):
    pass


class TestDelayContract(DelayConformance):
    pass


class TestTransactionContract(TransactionConformance):
    pass


class TestBrokerContract(BrokerConformance):
    pass
