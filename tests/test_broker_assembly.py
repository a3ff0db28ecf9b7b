"""Assembling a broker: parts are built in dependency order, so a plugin that calls the broker back
while it is being built reaches finished parts; a start that fails closes what it started."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from plugmq import Broker, ManualClock, Message
from plugmq.config.broker import load_config
from plugmq.core import Family, PluginDeclaration, hookimpl
from plugmq.core.contracts import (
    BrokerRole,
    ClusterContext,
    ConsumerHandover,
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationStatus,
)
from plugmq.core.errors import PluginError
from plugmq.core.message import SendStatus

PLUGINS = ["store_mmap", "filter_tag", "alloc"]
WITH_DELAY = [*PLUGINS, "delay_wheel"]


class _QuietReplication:
    """A replication service with no peers: what the broker asks of one, answered for a lone master."""

    capabilities = ReplicationCapabilities(sync_double_write=False)

    def __init__(self, context: ReplicationContext) -> None:
        self._context = context
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def await_replicated(self, end_offset: int) -> SendStatus:
        return SendStatus.SEND_OK

    def status(self) -> ReplicationStatus:
        end = self._context.store.log_end_offset() if self._context.store is not None else 0
        return ReplicationStatus(role=self._context.role, broker_id=self._context.broker_id, address="",
                                 end_offset=end, confirmed_offset=end)

    def close(self) -> None:
        self.closed = True


class CallsBackWhileBuilt:
    """A replication plugin that calls every broker callback from its factory, before the broker
    has started anything: the state those callbacks reach must be built already."""

    name = "calls_back_while_built"

    def __init__(self) -> None:
        self.handover: ConsumerHandover | None = None
        self.service: _QuietReplication | None = None

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families={Family.REPLICATION},
                                 capabilities=_QuietReplication.capabilities)

    @hookimpl
    def plugmq_make_replication_service(self, context: ReplicationContext) -> _QuietReplication:
        assert context.replicated is not None and context.truncated is not None and context.handover is not None
        assert context.adopt is not None and context.store is not None
        end = context.store.log_end_offset()
        context.truncated(end)
        context.replicated(end)
        self.handover = context.handover()
        context.adopt(ConsumerHandover(), end)
        self.service = _QuietReplication(context)
        return self.service


class NoClusterService:
    """A cluster plugin whose factory returns nothing: the broker's start fails at its last step."""

    name = "no_cluster_service"

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families={Family.CLUSTER})

    @hookimpl
    def plugmq_make_cluster_service(self, context: ClusterContext) -> None:
        return None


def _background_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("store_mmap-", "plugmq-", "delay_wheel"))]


def test_replication_callbacks_from_the_factory_reach_built_state(tmp_path: Path, clock: ManualClock) -> None:
    with Broker.open(tmp_path, plugins=PLUGINS, clock=clock) as broker:
        broker.create_topic("T", 1)
        with broker.producer("pg") as producer:
            producer.send(Message("T", b"first"))
            producer.send(Message("T", b"second"))
        [taken] = broker.simple_consumer("G", {"T": "*"}).receive(1, invisible_duration_s=60)
        assert taken.body == b"first"
    plugin = CallsBackWhileBuilt()
    with Broker.open(tmp_path, plugins=[*PLUGINS, plugin.name], plugin_objects={plugin.name: plugin},
                     clock=clock) as broker:
        assert plugin.service is not None and plugin.service.started
        assert broker.role is BrokerRole.ASYNC_MASTER and broker.replication is plugin.service
        assert plugin.handover == ConsumerHandover(), "a master's own readers have nothing to hand over"
        consumer = broker.simple_consumer("G", {"T": "*"})
        assert [m.body for m in consumer.receive(4, invisible_duration_s=60)] == [b"second"], (
            "the pop state rebuilt by the truncation callback still holds 'first' in flight")
        clock.advance(61)
        assert [m.body for m in consumer.receive(4, invisible_duration_s=60)] == [b"first", b"second"]
    assert plugin.service.closed


def test_a_start_failing_at_its_last_step_closes_what_it_started(tmp_path: Path, clock: ManualClock) -> None:
    plugin = NoClusterService()
    mapping: dict[str, Any] = {"broker": {"name": "broker-a", "data_dir": str(tmp_path),
                                          "plugins": [*WITH_DELAY, plugin.name]},
                               "cluster": {"name": "c1"}}
    before = _background_threads()
    with pytest.raises(PluginError, match="returned no cluster service"):
        Broker(load_config(mapping), clock=clock, plugin_objects={plugin.name: plugin})
    assert _background_threads() == before, "the store, delay and retention threads are stopped"
    with Broker.open(tmp_path, plugins=WITH_DELAY, clock=clock) as broker:  # the store's lock is released
        broker.create_topic("T", 1)
        assert broker.put(Message("T", b"after"), 0).status is SendStatus.SEND_OK
