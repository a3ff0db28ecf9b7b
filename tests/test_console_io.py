"""``plugmq send`` / ``plugmq consume``: one message in, messages out, on a stopped data dir and
against a running ``plugmq serve`` whose official-client traffic they meet."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plugmq.admin.messaging import consume_messages
from plugmq.broker.broker import Broker
from plugmq.cli import main
from plugmq.core import Message, MessageQueue
from plugmq.testing import WAIT_S, wait_for

TOPIC = "Console"


def _cli(config: Path, *args: str, stdin: str | None = None) -> Any:
    result = CliRunner().invoke(main, [*args, "--config", str(config), "--json"], input=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_send_and_consume_on_a_stopped_data_dir(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nplugins = ["store_mmap", "delay_wheel"]\n')
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "delay_wheel"]) as broker:
        broker.create_topic(TOPIC, 2)
    first = _cli(config, "send", TOPIC, "hello", "--key", "k1", "--tags", "t", "--property", "who=me")
    assert first["topic"] == TOPIC and first["queue_offset"] == 0
    _cli(config, "send", TOPIC, "--base64", stdin=base64.b64encode(b"\xff\x00raw").decode())
    _cli(config, "send", TOPIC, "in order", "--message-group", "order-7")

    got = _cli(config, "consume", TOPIC, "-n", "2")
    assert len(got) == 2
    rest = _cli(config, "consume", TOPIC, "-n", "10")
    everything = {m["unique_id"]: m for m in got + rest}
    assert len(everything) == 3, "each message once, none again"
    hello = everything[first["unique_id"]]
    assert (hello["body"], hello["keys"], hello["tags"], hello["properties"]["who"]) == ("hello", ["k1"], "t", "me")
    assert {(m["body"], m["body_encoding"]) for m in everything.values()} == {
        ("hello", "utf-8"), (base64.b64encode(b"\xff\x00raw").decode(), "base64"), ("in order", "utf-8")}
    assert _cli(config, "consume", TOPIC) == [], "the group consumed everything"
    assert len(_cli(config, "consume", TOPIC, "--group", "other", "-n", "10")) == 3, "another group reads all"

    result = CliRunner().invoke(main, ["send", TOPIC, "x", "--property", "novalue", "--config", str(config)])
    assert result.exit_code != 0 and "'novalue' is not NAME=VALUE" in result.output
    result = CliRunner().invoke(main, ["send", "bad topic!", "x", "--config", str(config)])
    assert result.exit_code != 0 and "bad topic!" in result.output


@pytest.mark.slow
def test_send_and_consume_against_plugmq_serve_meet_the_official_client(tmp_path: Path) -> None:
    serve = pytest.importorskip("tests.test_admin_serve", reason="needs the serve extra")
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\n[server]\nlong_polling_s = 1\nmetrics_listen = "127.0.0.1:0"\n')

    def cli(*args: str) -> Any:
        result = CliRunner().invoke(main, [*args, "--server", child.address, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    with serve.serving(config) as child:
        serve.AdminClient(child.address).call("update-topic", {"topic": TOPIC, "queue_count": 2})
        sent = cli("send", TOPIC, "from the console", "--key", "c1")
        consumer = serve.SimpleConsumer(serve.client_config(child.address), "officials",
                                        {TOPIC: serve.FilterExpression()})
        with serve.started(consumer):
            received = serve.receive(consumer, 1, 10)
            assert [(m.body, m.message_id) for m in received] == [(b"from the console", sent["unique_id"])]
            consumer.ack(received[0])
        with serve.started(serve.Producer(serve.client_config(child.address), (TOPIC,))) as producer:
            receipt = producer.send(serve.message(TOPIC, b"from the official client"))
        read = cli("consume", TOPIC, "-n", "5")
        assert {m["unique_id"]: m["body"] for m in read} == {
            sent["unique_id"]: "from the console", receipt.message_id: "from the official client"}
        assert cli("consume", TOPIC) == []
    with Broker.open(tmp_path / "data") as broker:  # two sends, two messages stored
        stored = sum(broker.max_offset(MessageQueue(TOPIC, broker.name, q)) for q in range(2))
        assert stored == 2


def test_consume_waits_for_a_message_sent_while_it_waits(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", plugins=["store_mmap"]) as broker:
        broker.create_topic(TOPIC, 1)
        assert consume_messages(broker, TOPIC, wait_s=0) == [], "no wait: what is there now"
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(consume_messages, broker, TOPIC, wait_s=WAIT_S)
            # The arrivals' count of waiters is the one sign that the consume is waiting, not reading.
            wait_for(lambda: broker._parts.arrivals.sleeping > 0, WAIT_S, "the consume to wait")
            broker.put(Message(TOPIC, b"late"), 0)
            assert [m.body for m in waiting.result(timeout=WAIT_S)] == ["late"]
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nplugins = ["store_mmap"]\n')
    result = CliRunner().invoke(main, ["consume", TOPIC, "--wait", "51", "--config", str(config)])
    assert result.exit_code != 0 and "wait_s must be a number of seconds 0..50" in result.output
