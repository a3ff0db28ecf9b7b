"""Rescheduling and cancelling delayed messages through the broker and the admin verbs, also
across a failover (the delay ledger writes the moved intent into the replicated log)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugmq.admin import BrokerAdmin, execute
from plugmq.broker.broker import Broker
from plugmq.cli import main
from plugmq.core import DelayUnsupportedError, ManualClock, Message, MessageQueue, ValidationError
from plugmq.testing import WAIT_S, wait_for
from tests.helpers.replication import end_of, following_pair

TOPIC = "Later"
START = 1_700_000_000


def _bodies(broker: Broker, queue: MessageQueue) -> list[bytes]:
    return [m.body for m in broker.pull(queue, 0, 100).messages]


def test_admin_moves_and_cancels_a_pending_delayed_message(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "delay_schedule"], clock=clock) as broker:
        broker.create_topic(TOPIC, 1)
        queue = MessageQueue(TOPIC, broker.name, 0)
        now = clock.now_ms()
        moved = broker.put(Message(TOPIC, b"moved", deliver_at_ms=now + 60_000), 0)
        gone = broker.put(Message(TOPIC, b"gone", deliver_at_ms=now + 10_000), 0)
        admin = BrokerAdmin(broker)
        answer = execute(admin, "delay-reschedule", {"id": moved.msg_id, "deliver_at_ms": now + 5_000})
        assert answer["moved"] and answer["new_msg_id"] not in (None, moved.msg_id)
        assert execute(admin, "delay-reschedule", {"id": moved.msg_id, "deliver_at_ms": now + 9_000}) == {
            "msg_id": moved.msg_id, "moved": False, "deliver_at_ms": now + 9_000, "new_msg_id": None}
        assert execute(admin, "delay-cancel", {"id": f"{gone.msg_id}:{gone.unique_id}"})["cancelled"]
        with pytest.raises(ValidationError, match="deliver_at_ms"):
            execute(admin, "delay-reschedule", {"id": moved.msg_id, "deliver_at_ms": "soon"})
        clock.advance(4.9)
        assert _bodies(broker, queue) == []
        clock.advance(0.2)
        wait_for(lambda: _bodies(broker, queue) == [b"moved"], WAIT_S, "the moved message at its new time")
        clock.advance(120)
        assert _bodies(broker, queue) == [b"moved"], "the cancelled one came, or the moved one came twice"


def test_delay_level_says_it_cannot_reschedule(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "delay_level"], clock=ManualClock(START)) as broker:
        sent = broker.put(Message(TOPIC, b"x", delay_level=2), 0)
        with pytest.raises(DelayUnsupportedError, match="cannot reschedule.*delay_wheel or delay_schedule"):
            broker.reschedule_delayed(sent.msg_id, broker.clock.now_ms() + 1000)


def test_cli_reschedules_and_deletes_a_group_on_a_stopped_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = tmp_path / "broker.toml"
    config.write_text(f'[broker]\ndata_dir = "{data}"\nplugins = ["store_mmap", "delay_wheel"]\n')
    with Broker.from_config(config) as broker:
        sent = broker.put(Message(TOPIC, b"x", deliver_at_ms=broker.clock.now_ms() + 3_600_000), 0)
        consumer = broker.simple_consumer("doomed", {TOPIC: "*"})
        consumer.receive(1, 1)
    runner = CliRunner()
    when = (datetime.now() + timedelta(days=10)).replace(microsecond=0)
    moved = runner.invoke(main, ["admin", "delay-reschedule", sent.msg_id, "--at", when.isoformat(),
                                 "--config", str(config)])
    assert moved.exit_code == 0, moved.output
    assert f"due at {when.date()}" in moved.output and "its msg id is now" in moved.output
    again = runner.invoke(main, ["admin", "delay-reschedule", sent.msg_id, "--at", "now", "--config", str(config)])
    assert again.exit_code == 0 and "not moved" in again.output
    deleted = runner.invoke(main, ["admin", "group-delete", "doomed", "--config", str(config), "--json"])
    assert deleted.exit_code == 0, deleted.output
    assert '"group": "doomed"' in deleted.output


def test_a_moved_message_keeps_its_new_time_across_a_failover(tmp_path: Path) -> None:
    clock = ManualClock(START)
    with following_pair(tmp_path, clock) as (a, b):
        a.create_topic(TOPIC, 1)
        queue = MessageQueue(TOPIC, a.name, 0)
        now = clock.now_ms()
        sooner = a.put(Message(TOPIC, b"sooner", deliver_at_ms=now + 60_000), 0)
        later = a.put(Message(TOPIC, b"later", deliver_at_ms=now + 20_000), 0)
        assert a.reschedule_delayed(sooner.msg_id, now + 30_000) is not None
        assert a.reschedule_delayed(later.msg_id, now + 90_000) is not None
        wait_for(lambda: end_of(b), WAIT_S, "the slave to catch up", until=lambda end: end == end_of(a))
        a.demote(None)
        b.promote(2)
        clock.advance(25)
        assert _bodies(b, queue) == [], "a message came at its old time after the failover"
        clock.advance(6)
        wait_for(lambda: _bodies(b, queue) == [b"sooner"], WAIT_S, "the moved-up message at its new time")
        clock.advance(60)
        wait_for(lambda: _bodies(b, queue) == [b"sooner", b"later"], WAIT_S, "the put-off message at its new time")
        clock.advance(60)
        assert _bodies(b, queue) == [b"sooner", b"later"], "a moved message was delivered twice"
