"""``plugmq serve`` as a real child process: kill -9 and restart keep acked and unacked state;
SIGTERM shuts down cleanly. Invisible times are real seconds here (the child runs the system clock)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from plugmq.core.errors import ValidationError
from plugmq.server.admin import AdminClient
from plugmq.testing import ServeProcess, serving, wait_for
from tests.helpers.clients import started

WAIT_S = 20.0


def _config(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=3)


def _consumer(address: str) -> SimpleConsumer:
    return SimpleConsumer(_config(address), "crash-g", {"Durable": FilterExpression()}, await_duration=1)


def test_kill_9_and_restart_keep_acked_and_unacked_state(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\n[server]\nlong_polling_s = 1\n', encoding="utf-8")
    log = tmp_path / "serve.log"
    first = ServeProcess(config, WAIT_S, log_path=log)
    try:
        address = first.await_address()
        with started(Producer(_config(address), ("Durable",))) as producer:
            sent = [producer.send(_make(i)).message_id for i in range(6)]
        with started(_consumer(address)) as consumer:
            got: list[Any] = []
            deadline = time.monotonic() + WAIT_S
            while len(got) < 4 and time.monotonic() < deadline:
                got.extend(consumer.receive(4 - len(got), 3))  # 3 s invisible
            assert len(got) == 4
            acked, unacked = got[:2], got[2:]
            for message in acked:
                consumer.ack(message)
    finally:
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    acked_ids = {m.message_id for m in acked}
    unacked_ids = {m.message_id for m in unacked}
    never_received = set(sent) - acked_ids - unacked_ids
    assert len(never_received) == 2

    second = ServeProcess(config, WAIT_S, log_path=log)
    try:
        with started(_consumer(second.await_address())) as consumer:
            attempts: dict[str, int] = {}
            deadline = time.monotonic() + WAIT_S
            while len(attempts) < 4 and time.monotonic() < deadline:
                for message in consumer.receive(16, 30):
                    assert message.message_id not in acked_ids, "an acked message came back after the restart"
                    attempts[message.message_id] = message.delivery_attempt
                    consumer.ack(message)
            assert consumer.receive(16, 30) == []
    finally:
        assert second.stop(signal.SIGTERM) == 0, f"unclean shutdown; see {log}"
    assert attempts == {**dict.fromkeys(unacked_ids, 2), **dict.fromkeys(never_received, 1)}
    assert "server stopped" in log.read_text() and "broker closed" in log.read_text()


def _make(i: int) -> Message:
    message = Message()
    message.topic = "Durable"
    message.body = f"m{i}".encode()
    return message


def test_sigterm_answers_a_waiting_long_poll_and_exits_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\n[server]\nlong_polling_s = 30\nshutdown_grace_s = 20\n',
                      encoding="utf-8")
    outcome: list[Any] = []
    with serving(config, WAIT_S) as child:
        with started(Producer(_config(child.endpoint), ("Durable",))) as producer:
            producer.send(_make(0))
        consumer = SimpleConsumer(_config(child.endpoint), "quiet", {"Durable": FilterExpression("NoSuchTag")},
                                  await_duration=25)
        with started(consumer):
            def poll() -> None:
                try:
                    outcome.append(consumer.receive(1, 30))
                except Exception as exc:  # noqa: BLE001 - the assertion below shows it
                    outcome.append(exc)

            waiter = threading.Thread(target=poll)
            waiter.start()
            with AdminClient(child.endpoint) as admin:  # the receive made the group's first pop; it waits after that
                wait_for(lambda: admin.call("consumer-progress", {"group": "quiet"}), WAIT_S,
                         "the receive's first pop (the group's pop progress)", ignoring=(ValidationError,),
                         interval=0.05)
            assert child.stop(signal.SIGTERM) == 0
            waiter.join(WAIT_S)
    assert outcome == [[]], f"the long poll was not answered before the shutdown: {outcome}"
