"""Closing a broker: every step runs even when one fails, and the broker's own records are not
held to the client's message size limit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from plugmq import Broker, ConsumeFrom, ConsumeStatus, ManualClock, Message
from plugmq.core import Family, PluginDeclaration, hookimpl
from plugmq.core.errors import MessageTooLargeError
from tests.fixtures.brokers import BrokerFactory

PLUGINS = ["store_mmap", "delay_wheel", "alloc"]


class FailsAtStop:
    """A plugin whose broker_stopping hook raises, as a buggy third-party plugin might."""

    name = "fails_at_stop"

    @hookimpl
    def plugmq_declare(self) -> PluginDeclaration:
        return PluginDeclaration(name=self.name, families={Family.EVENTS})

    @hookimpl
    def plugmq_broker_stopping(self, broker_name: str) -> None:
        raise RuntimeError(f"plugin bug while {broker_name} stops")


def consume_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("plugmq-consume", "store_mmap-"))]


def test_a_failing_step_still_closes_consumers_and_the_store(make_broker: BrokerFactory, tmp_path: Path,
                                                             clock: ManualClock) -> None:
    plugin = FailsAtStop()
    broker = Broker.open(tmp_path, plugins=[*PLUGINS, plugin.name], plugin_objects={plugin.name: plugin},
                         clock=clock, name="broker-c")
    broker.create_topic("T", 2)
    with broker.producer("pg") as producer:
        producer.send(Message("T", b"kept"))
    consumer = broker.push_consumer("G", lambda messages: ConsumeStatus.CONSUME_SUCCESS,
                                    consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe("T").start()
    assert consume_threads()
    with capture_logs() as logs, pytest.raises(RuntimeError, match="plugin bug while broker-c stops"):
        broker.close()
    assert [e["step"] for e in logs if e["event"].startswith("a step of closing the broker failed")] == [
        "broker_stopping hooks"]
    assert consume_threads() == [], "listener threads and the store's threads are stopped all the same"
    again = make_broker(PLUGINS, data_dir=tmp_path, name="broker-c")  # the lock is released
    queue = again.topic_queues("T")
    assert sum(again.max_offset(q) for q in queue) == 1


@pytest.mark.parametrize("store", ["store_mmap", "store_lmdb", "store_rocks"])
def test_state_records_are_not_held_to_a_small_client_limit(make_broker: BrokerFactory, store: str) -> None:
    """Offsets are records in the store; with max_message_size = 64 they are still written (the
    store takes the client limit plus headroom), while a client body over 64 bytes is refused."""
    group = "a_consumer_group_with_a_rather_long_name_that_makes_records_long"
    plugins = [store, "alloc"]
    broker = make_broker(plugins, max_message_size=64)
    broker.create_topic("T", 1)
    queue = broker.topic_queues("T")[0]
    with broker.producer("pg") as producer:
        for i in range(3):
            producer.send(Message("T", f"m{i}".encode()))
        with pytest.raises(MessageTooLargeError, match="the limit is 64"):
            producer.send(Message("T", b"x" * 65))
    consumer = broker.pull_consumer(group)
    consumer.commit(queue, 3)
    broker.close()
    broker = make_broker(plugins, max_message_size=64)
    assert broker.pull_consumer(group).committed_offset(broker.topic_queues("T")[0]) == 3
