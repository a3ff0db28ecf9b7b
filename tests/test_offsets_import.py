"""Consumer offsets of data dirs written before the journal (one JSON file per group) are imported
into the journal once, on the first open; the old directories are renamed ``*.imported``."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from plugmq.broker.broker import Broker
from plugmq.broker.offsets import DLQ_RESEND
from plugmq.core import Message, MessageQueue
from plugmq.core.errors import StoreError
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.legacy_state import write_legacy_offsets

PLUGINS = ["store_lmdb", "alloc"]
MEMBER = "192.168.0.7@4242"  # a client id; its file was named by the file-safe spelling


def _older_data_dir(make_broker: BrokerFactory, data_dir: Path) -> Path:
    """Messages on two queues of T, then the broker closed and offset files written as before the
    journal: group g at 2 and 1, broadcasting member MEMBER of bg at 2, g's resend cursor at 1."""
    broker = make_broker(PLUGINS, data_dir=data_dir)
    broker.create_topic("T", 2)
    for i in range(4):
        broker.put(Message("T", f"m{i}".encode()), i % 2)
    name = broker.name
    broker.close()
    broker_dir = data_dir / "broker"
    write_legacy_offsets(broker_dir, "g", {f"T@{name}@0": 2, f"T@{name}@1": 1})
    write_legacy_offsets(broker_dir, "bg", {f"T@{name}@0": 2}, member="192_168_0_7_4242")  # its file-safe name
    write_legacy_offsets(broker_dir, "g", {f"%DLQ%g@{name}@0": 1}, dlq_resend=True)
    return broker_dir


def _assert_imported(broker: Broker) -> None:
    q0, q1 = (MessageQueue("T", broker.name, i) for i in range(2))
    assert broker.consumer_offsets.group_names() == ["g"]
    assert (broker.offsets("g").read(q0), broker.offsets("g").read(q1)) == (2, 1)
    assert broker.offsets("bg", MEMBER).read(q0) == 2
    assert broker.consumer_offsets.view("g", kind=DLQ_RESEND).read(MessageQueue("%DLQ%g", broker.name, 0)) == 1
    consumer = broker.pull_consumer("g")
    assert [m.body for m in consumer.pull(q0, 2, 8).messages] == [], "m0 and m2 consumed"
    assert (consumer.committed_offset(q0), consumer.committed_offset(q1)) == (2, 1)
    assert [m.body for m in consumer.pull(q1, 1, 8).messages] == [b"m3"]


def test_offset_files_are_imported_once_and_their_directories_renamed(make_broker: BrokerFactory,
                                                                       tmp_path: Path) -> None:
    data_dir = tmp_path / "older"
    broker_dir = _older_data_dir(make_broker, data_dir)
    with capture_logs() as logs:
        broker = make_broker(PLUGINS, data_dir=data_dir)
    assert any(e["event"] == "consumer offsets imported into the journal" and e["tables"] == 3 for e in logs)
    _assert_imported(broker)
    assert not (broker_dir / "offsets").exists() and not (broker_dir / "dlq-resend").exists()
    assert (broker_dir / "offsets.imported" / "g.json").is_file()
    assert (broker_dir / "dlq-resend.imported" / "g.json").is_file()
    broker.offsets("g").update(MessageQueue("T", broker.name, 1), 2)  # moves on in the journal
    broker.close()
    broker = make_broker(PLUGINS, data_dir=data_dir)  # from the journal now, not the renamed files
    assert broker.offsets("g").read(MessageQueue("T", broker.name, 1)) == 2
    assert broker.offsets("bg", MEMBER).read(MessageQueue("T", broker.name, 0)) == 2


def test_offset_files_beside_a_journal_that_holds_offsets_are_ignored(make_broker: BrokerFactory,
                                                                       tmp_path: Path) -> None:
    broker = make_broker(PLUGINS)
    broker.create_topic("T", 1)
    queue = MessageQueue("T", broker.name, 0)
    broker.offsets("g").update(queue, 1)
    broker.close()
    write_legacy_offsets(tmp_path / "data" / "broker", "g", {f"T@{broker.name}@0": 7})
    with capture_logs() as logs:
        broker = make_broker(PLUGINS)
    assert broker.offsets("g").read(queue) == 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "offset files from before the journal ignored: the journal already holds offsets"]
    assert (tmp_path / "data" / "broker" / "offsets" / "g.json").is_file(), "left where it was for the operator"


def test_an_unreadable_offset_file_is_named_and_nothing_is_imported(make_broker: BrokerFactory,
                                                                     tmp_path: Path) -> None:
    data_dir = tmp_path / "older"
    broker_dir = _older_data_dir(make_broker, data_dir)
    torn = broker_dir / "offsets" / "g.json"
    torn.write_text('{"T@broker-a@0": 2', encoding="utf-8")  # torn mid-write
    with pytest.raises(StoreError, match=f"offset file {torn} is unreadable.*restore it or delete it"):
        make_broker(PLUGINS, data_dir=data_dir)
    assert torn.is_file() and not (broker_dir / "offsets.imported").exists()
    torn.unlink()  # what the error says to do: the group starts from its consume-from position
    broker = make_broker(PLUGINS, data_dir=data_dir)
    assert broker.consumer_offsets.group_names() == []
    assert broker.offsets("bg", MEMBER).read(MessageQueue("T", broker.name, 0)) == 2
