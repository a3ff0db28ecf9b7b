"""Role switches without a name service: brokers with ``failover = true`` promoted and demoted by
hand, real stores, real TCP on loopback. State travels with the log (offsets, pop progress, the
transaction op log); a returning old master is cut back to where it agrees with the new master.

Waits poll real state with a deadline; the brokers' clocks are ManualClocks (check-backs, pop
deadlines), so nothing sleeps for a delay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from plugmq.broker.broker import Broker
from plugmq.client.transactions import TransactionProducer
from plugmq.core import BrokerRole, ConfigError, ManualClock, Message, MessageQueue, StoredMessage, TransactionDecision
from plugmq.core.errors import PluginError, ReadOnlyBrokerError
from plugmq.testing import WAIT_S, wait_for
from tests.fixtures.brokers import BrokerFactory
from tests.helpers.replication import end_of
from tests.helpers.services import replication_of

PLUGINS = ["store_mmap", "filter_tag", "alloc", "txn", "ha"]
TOPIC = "Failover"
# min_in_sync_replicas = 1, as in the README's failover example: a sync_master promoted while its
# peer is down acks alone.
HA = {"heartbeat_ms": 100, "peer_timeout_ms": 3000, "reconnect_ms": 20, "reconnect_max_ms": 200,
      "sync_timeout_ms": 2000, "min_in_sync_replicas": 1}


class Group:
    """Brokers of one broker name under tmp_path on the test's ManualClock, opened by ``make_broker``
    (so all are closed at teardown)."""

    def __init__(self, make: BrokerFactory, root: Path, clock: ManualClock) -> None:
        self.make = make
        self.root = root
        self.clock = clock

    def open(self, name: str, broker_id: int, role: str = "async_master", plugins: Sequence[str] = PLUGINS) -> Broker:
        return self.make(plugins, data_dir=self.root / name, role=role, failover=True, broker_id=broker_id,
                         store_host=f"127.0.0.{broker_id + 1}:10911", options={"ha": HA, "txn": {"fsync": False}})


@pytest.fixture
def group(make_broker: BrokerFactory, tmp_path: Path, clock: ManualClock) -> Group:
    return Group(make_broker, tmp_path, clock)


def follow(slave: Broker, master: Broker) -> None:
    slave.follow(master.replication.master_address)  # type: ignore[union-attr]
    wait_for(lambda: master.replication.status().slaves, WAIT_S, "the slave to connect")  # type: ignore[union-attr]


def master_and_slave(group: Group, role: str = "async_master",
                     plugins: Sequence[str] = PLUGINS) -> tuple[Broker, Broker]:
    """Brokers a (promoted at epoch 1, TOPIC created on it) and b (following a)."""
    a, b = group.open("a", 1, role, plugins), group.open("b", 2, role, plugins)
    a.promote(1)
    follow(b, a)
    a.create_topic(TOPIC, 1)
    return a, b


def caught_up(slave: Broker, master: Broker) -> None:
    """The slave holds the master's log and knows all of it committed (its readers see it all)."""
    wait_for(lambda: end_of(slave) == end_of(master), WAIT_S, "the slave to catch up")
    wait_for(lambda: slave.replication.committed_offset() == end_of(master), WAIT_S,  # type: ignore[union-attr]
             "the slave to hear the master's commit point")


class Checker:
    def __init__(self, answer: TransactionDecision) -> None:
        self.answer = answer
        self.asked: list[bytes] = []

    def __call__(self, message: StoredMessage) -> TransactionDecision:
        self.asked.append(message.body)
        return self.answer


def by_arg(_message: Message, arg: TransactionDecision) -> TransactionDecision:
    return arg


def test_a_failover_broker_starts_read_only_and_takes_writes_once_promoted(group: Group) -> None:
    broker = group.open("a", 1)
    assert (broker.role, broker.epoch) == (BrokerRole.SLAVE, 0)
    with pytest.raises(ReadOnlyBrokerError):
        broker.put(Message(TOPIC, b"x"), 0)
    broker.promote(1)
    assert (broker.role, broker.epoch) == (BrokerRole.ASYNC_MASTER, 1)
    broker.put(Message(TOPIC, b"x"), 0)
    assert replication_of(broker).status().epoch == 1


def test_failover_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mode this broker works in"):
        Broker.open(tmp_path / "a", plugins=PLUGINS, role="slave", failover=True, broker_id=1)
    with pytest.raises(PluginError, match="failover = true needs a replication plugin"):
        Broker.open(tmp_path / "b", plugins=["store_mmap"], failover=True)


def test_state_follows_the_log_and_survives_promotion(group: Group) -> None:
    """Offsets, pop progress and transactions on the master; the slave follows them as they
    arrive; promoted, it delivers nothing acked again, keeps settled transactions settled and
    checks the open one back."""
    a, b = master_and_slave(group, "sync_master")
    for i in range(6):
        assert a.put(Message(TOPIC, f"m{i}".encode()), 0).status.value == "SEND_OK"
    consumer = a.simple_consumer("pop-g", {TOPIC: "*"})
    got = consumer.receive(4, 30)
    for message in got[:3]:
        consumer.ack(message)
    queue = MessageQueue(TOPIC, a.name, 0)
    a.offsets("pull-g").update(queue, 5)
    settled = TransactionProducer(a, "pg", by_arg, Checker(TransactionDecision.COMMIT))
    settled.send_in_transaction(Message(TOPIC, b"committed"), TransactionDecision.COMMIT)
    settled.send_in_transaction(Message(TOPIC, b"rolled-back"), TransactionDecision.ROLLBACK)
    settled.send_in_transaction(Message(TOPIC, b"open"), TransactionDecision.UNKNOWN)
    caught_up(b, a)
    assert b.offsets("pull-g").read(queue) == 5, "the slave follows committed offsets"
    assert b.pop.progress("pop-g") == a.pop.progress("pop-g"), "the slave follows pop progress"

    a.close()
    b.promote(2)
    assert b.role is BrokerRole.SYNC_MASTER and b.epoch == 2
    checker = Checker(TransactionDecision.COMMIT)
    b.transaction_producer("pg", by_arg, checker)
    group.clock.advance(7)  # past the transaction timeout: the open one is checked back
    assert checker.asked == [b"open"], "only the open transaction is checked back by the new master"
    bodies = sorted(m.body for m in b.pull(queue, 0, 100).messages)
    assert bodies == sorted([f"m{i}".encode() for i in range(6)] + [b"committed", b"open"])
    group.clock.advance(31)  # the unacked one comes back; the acked ones never do
    again = b.simple_consumer("pop-g", {TOPIC: "*"}).receive(16, 30)
    assert sorted(m.body for m in again) == [b"committed", b"m3", b"m4", b"m5", b"open"]
    assert {m.body: m.delivery_attempt for m in again}[b"m3"] == 2
    assert b.offsets("pull-g").read(queue) == 5


def test_a_returning_old_master_is_cut_back_to_the_new_masters_history(group: Group) -> None:
    a, b = master_and_slave(group)
    for i in range(5):
        a.put(Message(TOPIC, f"common-{i}".encode()), 0)
    caught_up(b, a)
    common_end = end_of(a)
    b.follow("127.0.0.1:1")  # the link breaks (nothing listens there): b hears nothing more from a
    for i in range(3):
        a.put(Message(TOPIC, f"only-on-a-{i}".encode()), 0)  # async_master: acked, never replicated
    a.simple_consumer("g", {TOPIC: "*"}).receive(8, 30)  # state records that will be cut too
    assert end_of(a) > common_end
    a.close()
    b.promote(2)
    for i in range(2):
        b.put(Message(TOPIC, f"new-{i}".encode()), 0)

    returning = group.open("a", 1)  # the old master restarts: a slave until told otherwise
    assert returning.role is BrokerRole.SLAVE and returning.epoch == 1
    assert returning.pop.progress("g"), "its own (soon cut) pop state is what it replays at open"
    follow(returning, b)
    caught_up(returning, b)
    queue = MessageQueue(TOPIC, b.name, 0)
    assert [m.body for m in returning.pull(queue, 0, 100).messages] == \
        [m.body for m in b.pull(queue, 0, 100).messages]
    assert not any(m.body.startswith(b"only-on-a") for m in returning.pull(queue, 0, 100).messages)
    assert returning.pop.progress("g") == [], "the cut removed the state records with the messages"
    assert returning.epoch == 2
    status = b.replication.status()  # type: ignore[union-attr]
    assert status.epoch == 2 and [s.broker_id for s in status.slaves] == [1]
    with pytest.raises(ReadOnlyBrokerError):
        returning.put(Message(TOPIC, b"stale"), 0)


def test_a_stale_master_is_fenced_by_a_slave_that_knows_a_newer_epoch(group: Group) -> None:
    a, b = group.open("a", 1), group.open("b", 2)
    a.promote(1)
    b.promote(2)  # b was elected while a did not know yet
    b.put(Message(TOPIC, b"x"), 0)
    b.demote(a.replication.master_address)  # type: ignore[union-attr]
    wait_for(lambda: b.replication._slave.last_error, WAIT_S, "the stale master to refuse b",  # type: ignore[union-attr]
             until=lambda error: "fenced" in error)
    assert b.role is BrokerRole.SLAVE and b.epoch == 2


def test_broker_status_shows_role_epoch_and_lag(group: Group) -> None:
    from plugmq.admin.operations import BrokerAdmin
    from plugmq.server.metrics import BrokerCollector, EventCounter

    a, b = group.open("a", 1), group.open("b", 2)
    assert BrokerAdmin(a).broker_status().role == "slave"
    a.promote(1)
    follow(b, a)
    a.create_topic(TOPIC, 1)
    for i in range(3):
        a.put(Message(TOPIC, f"m{i}".encode()), 0)
    caught_up(b, a)
    wait_for(lambda: BrokerAdmin(a).broker_status().replication["slaves"][0]["lag_bytes"] == 0, WAIT_S, "the ACK")
    master, slave = BrokerAdmin(a).broker_status(), BrokerAdmin(b).broker_status()
    assert (master.role, master.epoch, slave.role, slave.epoch) == ("async_master", 1, "slave", 1)
    assert master.replication["slaves"][0]["broker_id"] == 2
    assert master.replication["slaves"][0]["lag_messages"] == 0
    assert slave.replication["connected"] and slave.replication["lag_bytes"] == 0
    metrics = {(m.name, tuple(sorted(s.labels.items())), s.value) for m in BrokerCollector(a, EventCounter()).collect()
               for s in m.samples}
    assert ("plugmq_broker_info", (("broker", a.name), ("role", "async_master")), 1.0) in metrics
    assert ("plugmq_master_epoch", (("broker", a.name),), 1.0) in metrics
    assert ("plugmq_replication_lag_bytes", (("broker", a.name), ("slave_id", "2")), 0.0) in metrics
    assert ("plugmq_replication_lag_messages", (("broker", a.name), ("slave_id", "2")), 0.0) in metrics
    b.follow("127.0.0.1:1")  # b hears nothing more: what a writes next is lag
    a.put(Message(TOPIC, b"late"), 0)
    wait_for(lambda: not BrokerAdmin(a).broker_status().replication["slaves"], WAIT_S, "the slave to leave")
    assert BrokerAdmin(a).broker_status().replication["lag_bytes"] == 0  # no slave: nothing to lag behind


@pytest.mark.parametrize("delay_plugin", ["delay_wheel", "delay_level"])
def test_delayed_messages_due_before_during_and_after_a_failover(group: Group, delay_plugin: str) -> None:
    """Delayed messages are intents in the replicated log: the promoted slave delivers what its
    master had pending, none lost, none twice, none early; the old master, promoted again later,
    does not deliver its own stale copies of what the other master delivered meanwhile."""
    clock = group.clock
    plugins = [*PLUGINS, delay_plugin]
    a, b = master_and_slave(group, "sync_master", plugins)
    queue = MessageQueue(TOPIC, a.name, 0)
    start_ms = clock.now_ms()
    # delay_level: level 3 = 10 s, 4 = 30 s, 5 = 60 s (RocketMQ's levels); delay_wheel: the same times.
    due_s = {"before": 10, "during": 30, "after": 60}
    for phase, seconds in due_s.items():
        for i in range(3):
            message = (Message(TOPIC, f"{phase}-{i}".encode(), delay_level=[10, 30, 60].index(seconds) + 3)
                       if delay_plugin == "delay_level"
                       else Message(TOPIC, f"{phase}-{i}".encode(), deliver_at_ms=start_ms + seconds * 1000))
            assert a.put(message, 0).status.value == "SEND_OK"
    if delay_plugin == "delay_wheel":  # cancelled on the master: no later master delivers it
        doomed = a.put(Message(TOPIC, b"cancelled", deliver_at_ms=start_ms + 45_000), 0)
        assert a.cancel_delayed(doomed.msg_id)
    clock.advance(12)  # the "before" ones come due on the master
    wait_for(lambda: len(a.pull(queue, 0, 100).messages) == 3, WAIT_S, "the master to deliver the first three")
    caught_up(b, a)

    a.demote(None)  # the master loses its place (its session expired); its delay plugin keeps its files
    clock.advance(25)  # the "during" ones come due while no master is up: nothing delivers them
    assert len(b.pull(queue, 0, 100).messages) == 3
    b.promote(2)
    clock.advance(1)  # timers run as the (manual) clock moves
    wait_for(lambda: len(b.pull(queue, 0, 100).messages) == 6, WAIT_S, "the new master to deliver the overdue three")
    clock.advance(30)
    wait_for(lambda: len(b.pull(queue, 0, 100).messages) == 9, WAIT_S, "the new master to deliver the last three")

    delivered = b.pull(queue, 0, 100).messages
    assert sorted(m.body for m in delivered) == sorted(
        f"{phase}-{i}".encode() for phase in due_s for i in range(3)), "none lost, none twice"
    for stored in delivered:
        due_ms = start_ms + due_s[stored.body.decode().split("-")[0]] * 1000
        assert stored.store_timestamp_ms >= due_ms, f"{stored.body!r} was delivered early"

    # The old master comes back under the new one, and is promoted again later: the copies its
    # own delay plugin still holds were delivered by b, so they are not written a second time.
    follow(a, b)
    caught_up(a, b)
    b.demote(None)
    a.promote(3)
    clock.advance(120)
    a.put(Message(TOPIC, b"after-all"), 0)
    assert [m.body for m in a.pull(queue, 0, 100).messages][:9] == [m.body for m in delivered]
    assert len(a.pull(queue, 0, 100).messages) == 10, "nothing delivered twice after a second promotion"
