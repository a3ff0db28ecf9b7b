"""A slave's readers' progress, made while its master was down, handed over to the returning master.

Embedded brokers with the ha plugin, real stores, real TCP on loopback; the master is closed and
reopened on the same data dir and replication address. What the slave's readers acknowledged is
not delivered again by the master; what they left in flight is; groups the slave's readers never
touched keep the master's own progress.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from plugmq.broker.broker import Broker
from plugmq.core import Message
from plugmq.core.contracts import ConsumerHandover
from plugmq.testing import WAIT_S, wait_for
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.replication import end_of

PLUGINS = ["store_mmap", "filter_tag", "alloc", "ha"]
TOPIC = "Orders"
INVISIBLE_MS = 60_000


class Pair:
    """A master (reopenable at one replication address) and its slave on the test's ManualClock,
    opened by ``make_broker`` (so all are closed at teardown)."""

    def __init__(self, make: BrokerFactory, root: Path) -> None:
        self.make = make
        self.root = root
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{sock.getsockname()[1]}"

    def master(self) -> Broker:
        return self.make(PLUGINS, data_dir=self.root / "master",
                         options={"ha": {"listen": self.address, "heartbeat_ms": 100, "peer_timeout_ms": 3000}})

    def slave(self) -> Broker:
        return self.make(PLUGINS, data_dir=self.root / "slave", role="slave", broker_id=1, store_host="127.0.0.9:10911",
                         options={"ha": {"master": self.address, "heartbeat_ms": 100, "peer_timeout_ms": 3000,
                                         "reconnect_ms": 20, "reconnect_max_ms": 100}})


@pytest.fixture
def pair(make_broker: BrokerFactory, tmp_path: Path) -> Pair:
    return Pair(make_broker, tmp_path)


def connected(slave: Broker) -> bool:
    return bool(slave.replication.status().connected)  # type: ignore[union-attr]


def test_the_returning_master_takes_over_what_the_slaves_readers_acknowledged(pair: Pair) -> None:
    master = pair.master()
    slave = pair.slave()
    sent = [master.put(Message(TOPIC, f"m{i}".encode()), i % 4) for i in range(20)]
    early = master.pop.receive("g", TOPIC, None, 4, INVISIBLE_MS, only_queue=1)  # the master's own progress first
    for message in early:
        master.pop.ack("g", TOPIC, message.receipt_handle)
    wait_for(lambda: end_of(slave), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(master))
    master.close()  # no master of the name is up: the slave serves its readers
    wait_for(lambda: not connected(slave), WAIT_S, "the slave to notice")

    received = slave.pop.receive("g", TOPIC, None, 32, INVISIBLE_MS)
    assert {m.msg_id for m in received} == {r.msg_id for r in sent} - {m.msg_id for m in early}
    kept = max((m for m in received if m.queue_id == 0), key=lambda m: m.queue_offset)  # left in flight
    for message in received:
        if message is not kept:
            slave.pop.ack("g", TOPIC, message.receipt_handle)
    assert kept.queue_offset == 4
    assert slave.pop.state.handover() == ConsumerHandover([("g", TOPIC, 0, 4), ("g", TOPIC, 1, 5), ("g", TOPIC, 2, 5),
                                                          ("g", TOPIC, 3, 5)])

    with capture_logs() as logs:
        master = pair.master()
        wait_for(lambda: connected(slave), WAIT_S, "the slave to follow the returning master")
    assert any(e["event"].startswith("consumer progress handed over by a slave") and e["moved"] == 4 for e in logs)
    assert not slave.pop.state.handover(), "handed over once"
    again = master.pop.receive("g", TOPIC, None, 32, INVISIBLE_MS)
    assert [m.msg_id for m in again] == [kept.msg_id], "only what the slave's readers left in flight comes again"
    untouched = master.pop.receive("other", TOPIC, None, 32, INVISIBLE_MS)
    assert len(untouched) == 20, "a group the slave's readers never read keeps its own progress"
    # The master's moves are records of its log: the slave follows them.
    wait_for(lambda: slave.pop.progress("g"), WAIT_S, "the slave to follow the adopted progress",
             until=lambda progress: progress == master.pop.progress("g"))


def test_a_handover_never_moves_the_master_back_nor_past_the_log_both_share(pair: Pair) -> None:
    master = pair.master()
    stored = [master.put(Message(TOPIC, f"m{i}".encode()), 0) for i in range(8)]
    end = end_of(master)
    taken = master.pop.receive("g", TOPIC, None, 6, INVISIBLE_MS, only_queue=0)
    for message in taken:
        master.pop.ack("g", TOPIC, message.receipt_handle)
    assert master.pop.adopt(ConsumerHandover([("g", TOPIC, 0, 3)]), end) == 0, "the master is past what the slave saw"
    assert master.pop.adopt(ConsumerHandover([("g", TOPIC, 0, 6), ("g", "NoSuchTopic", 0, 4), ("g", TOPIC, 9, 4),
                             ("bad group!", TOPIC, 0, 4)]), end) == 0
    assert master.pop.adopt(ConsumerHandover([("late", TOPIC, 0, 6)]), end) == 1, "a group the master never saw starts where the slave got"
    assert [m.queue_offset for m in master.pop.receive("late", TOPIC, None, 8, INVISIBLE_MS, only_queue=0)] == [6, 7]
    # A slave that was ahead of this master (cut back to where both agree, after message 4): its
    # readers' acks beyond that point were of messages this master does not have at those offsets.
    fifth = master.query_by_id(stored[4].msg_id)
    assert fifth is not None and fifth.queue_offset == 4
    shared = fifth.commit_log_offset + fifth.size
    assert master.pop.adopt(ConsumerHandover([("ahead", TOPIC, 0, 8)]), shared) == 1
    assert [m.queue_offset for m in master.pop.receive("ahead", TOPIC, None, 8, INVISIBLE_MS, only_queue=0)] == [5, 6, 7]
    assert master.pop.adopt(ConsumerHandover([("g", TOPIC, 0, 8)]), shared) == 0, "clamped below the master's own position: no move"
