"""``plugmq admin`` and the metrics endpoint against a real ``plugmq serve`` child (free ports, the
official RocketMQ client), then on its stopped data dir. Most calls go through the admin client
(the endpoint's own protocol); the CLI runs as a real process, its output to a pipe, where its
output is what is checked. The child runs on the system clock: invisible times are real seconds,
and every wait is bounded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
pytest.importorskip("prometheus_client", reason="needs the serve extra (prometheus_client)")

from prometheus_client.parser import text_string_to_metric_families
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from plugmq import testing
from plugmq.core.errors import TopicError
from plugmq.server.admin import AdminClient
from plugmq.testing import ServeProcess, wait_for
from tests.helpers.clients import started

WAIT_S = 20.0
_CLI = "from plugmq.cli import main; main()"
CONFIG = """\
[broker]
data_dir = "data"
auto_create_topic = false

[groups.fragile]
max_delivery_attempts = 1

[server]
long_polling_s = 1
metrics_listen = "127.0.0.1:0"
"""


@attrs.frozen
class Served:
    """A ``plugmq serve`` child on free ports and the URL its JSON log says the metrics are at."""

    process: ServeProcess
    metrics: str

    @property
    def address(self) -> str:
        return self.process.endpoint


@contextmanager
def serving(config: Path) -> Iterator[Served]:
    """``plugmq serve`` with ``config`` (logging JSON lines to serve.log); it must shut down cleanly."""
    with testing.serving(config, WAIT_S, log_path=config.parent / "serve.log", log_json=True) as child:
        yield Served(child, _metrics_url(child.log_path))
        assert child.stop() == 0, f"unclean shutdown; see {child.log_path}"


def _metrics_url(log: Path) -> str:
    for line in log.read_text().splitlines():
        if '"metrics served"' in line:
            return str(json.loads(line)["url"])
    raise AssertionError(f"no 'metrics served' line in {log}")


def admin(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``plugmq admin ARGS`` as a process, stdout to a pipe."""
    done = subprocess.run([sys.executable, "-c", _CLI, "admin", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})
    if check:
        assert done.returncode == 0, done.stderr
    return done


def admin_json(*args: str) -> Any:
    return json.loads(admin(*args, "--json").stdout)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(value for (sample, label_set), value in samples.items()
               if sample == name and set(labels.items()) <= set(label_set))


def one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def message(topic: str, body: bytes, keys: str | None = None) -> Message:
    out = Message()
    out.topic = topic
    out.body = body
    if keys:
        out.keys = keys
    return out


def client_config(address: str) -> ClientConfiguration:
    return ClientConfiguration(address, Credentials(), request_timeout=3)


def receive(consumer: SimpleConsumer, want: int, invisible_s: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        got.extend(consumer.receive(want - len(got), invisible_s))
    return got


def lag(client: AdminClient, metrics: str, group: str) -> tuple[int, int, float, float]:
    """(admin lag, admin in flight, metrics lag, metrics in flight) of ``group``."""
    progress = client.call("consumer-progress", {"group": group})
    samples = scrape(metrics)
    return (progress["lag"], progress["inflight"],
            metric_sum(samples, "rocketmq_consumer_lag_messages", consumer_group=group),
            metric_sum(samples, "rocketmq_consumer_inflight_messages", consumer_group=group))


@pytest.mark.slow
def test_admin_and_metrics_against_plugmq_serve_then_on_its_stopped_data_dir(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG, encoding="utf-8")
    figures: dict[str, Any] = {}
    with serving(config) as child, AdminClient(child.address) as client:
        server = ("--server", child.address)
        assert admin("update-topic", "Orders", "--queues", "2", *server).stdout.strip() == \
            "created topic Orders with 2 queues"
        client.call("update-topic", {"topic": "Fragile", "queue_count": 1})
        one_line_error(admin("update-topic", "Orders", "--queues", "1", *server, check=False), "never shrinks")
        one_line_error(admin("topic-list", "--config", str(config), check=False), "--server HOST:PORT")

        # Lag goes up with sends and down with acks: in consumer-progress and in the metrics alike.
        with started(Producer(client_config(child.address), ("Orders", "Fragile"))) as producer, \
                started(SimpleConsumer(client_config(child.address), "billing", {"Orders": FilterExpression()},
                                       await_duration=1)) as consumer:
            assert consumer.receive(16, 30) == []  # the group takes a position at the (empty) queues
            figures["lag_start"] = lag(client, child.metrics, "billing")
            sent = [producer.send(message("Orders", f"order-{i}".encode(), keys=f"k{i}")).message_id
                    for i in range(5)]
            figures["lag_after_5_sends"] = lag(client, child.metrics, "billing")
            got = receive(consumer, 5, 30)
            figures["lag_after_5_received"] = lag(client, child.metrics, "billing")
            for received in got[:3]:
                consumer.ack(received)
            figures["lag_after_3_acks"] = lag(client, child.metrics, "billing")
            for received in got[3:]:
                consumer.ack(received)
            figures["lag_after_5_acks"] = lag(client, child.metrics, "billing")
            assert figures["lag_start"] == (0, 0, 0, 0)
            assert figures["lag_after_5_sends"] == (5, 0, 5, 0)
            assert figures["lag_after_5_received"] == (5, 5, 5, 5)
            assert figures["lag_after_3_acks"] == (2, 2, 2, 2)
            assert figures["lag_after_5_acks"] == (0, 0, 0, 0)

            # A dead letter resent is consumable again (max_delivery_attempts = 1: an unacked receive
            # is dead-lettered when its 1 s invisible time runs out).
            fragile_id = producer.send(message("Fragile", b"breakable")).message_id
            with started(SimpleConsumer(client_config(child.address), "fragile",
                                        {"Fragile": FilterExpression()}, await_duration=1)) as fragile:
                (first,) = receive(fragile, 1, 1)
                assert first.body == b"breakable"
                topics = wait_for(lambda: {t["topic"]: t["messages"] for t in client.call("topic-list", {})}, WAIT_S,
                                  "the message in %DLQ%fragile", until=lambda now: now.get("%DLQ%fragile"), interval=0.2)
                assert topics.get("%DLQ%fragile") == 1, topics
                assert fragile.receive(16, 30) == []
                resent = client.call("resend-dlq", {"group": "fragile"})
                assert [(r["original_topic"], r["topic"], r["unique_id"]) for r in resent["resent"]] == [
                    ("Fragile", "Fragile", fragile_id)]
                (again,) = receive(fragile, 1, 30)
                assert (again.body, again.message_id, again.delivery_attempt) == (b"breakable", fragile_id, 1)
                fragile.ack(again)
                assert client.call("resend-dlq", {"group": "fragile"})["resent"] == []  # not twice
            samples = scrape(child.metrics)
            figures["dlq_total"] = metric_sum(samples, "rocketmq_send_to_dlq_messages_total", consumer_group="fragile")
            figures["messages_in"] = metric_sum(samples, "rocketmq_messages_in_total", topic="Orders")
            figures["messages_out"] = metric_sum(samples, "rocketmq_messages_out_total", consumer_group="billing")
            assert (figures["dlq_total"], figures["messages_in"], figures["messages_out"]) == (1, 5, 5)
            assert metric_sum(samples, "plugmq_store_append_latency_seconds_count") >= 8
            assert metric_sum(samples, "process_cpu_seconds_total") > 0
            assert metric_sum(samples, "rocketmq_storage_size") > 0

        # query-msg by the id the client saw, by key, by time; topic-status
        (found,) = admin_json("query-msg", "--id", sent[2], *server)
        assert (found["body"], found["keys"], found["topic"]) == ("order-2", ["k2"], "Orders")
        assert [m["body"] for m in client.call("query-msg", {"key": "k4", "topic": "Orders"})] == ["order-4"]
        by_time = client.call("query-msg", {"topic": "Orders", "begin_ms": found["stored_ms"]})
        assert {"order-2", "order-3", "order-4"} <= {m["body"] for m in by_time}
        one_line_error(admin("query-msg", "--id", "no-such-id", *server, check=False), "no message with id no-such-id")
        status = client.call("topic-status", {"topic": "Orders"})
        assert sum(q["max_offset"] for q in status["queues"]) == 5
        with pytest.raises(TopicError, match="does not exist"):
            client.call("topic-status", {"topic": "Nope"})

        # Tables are as wide as their content: no id is broken, in a pipe or a 30-column terminal.
        everything = client.call("query-msg", {"topic": "Orders", "begin_ms": 0})
        for env in ({}, {"COLUMNS": "30", "TTY_COMPATIBLE": "1"}):
            table = admin("query-msg", "--topic", "Orders", "--time", "0", *server, env=env).stdout
            lines = re.sub(r"\x1b\[[0-9;]*m", "", table).splitlines()
            for value in [m[field] for m in everything for field in ("msg_id", "unique_id")]:
                assert any(value in line for line in lines), (value, table)

    # The same verbs on the stopped data dir; a reset there is what the restarted server serves.
    offline = ("--config", str(config))
    assert [m["body"] for m in admin_json("query-msg", "--id", sent[0], *offline)] == ["order-0"]
    reset = admin_json("reset-offset", "billing", "Orders", "--time", "0", *offline)
    assert sorted((q["mode"], q["offset"]) for q in reset["queues"]) == [("pop", 0), ("pop", 0)]
    assert admin_json("consumer-progress", "billing", *offline)["lag"] == 5
    with serving(config) as child, started(SimpleConsumer(client_config(child.address), "billing",
                                                          {"Orders": FilterExpression()}, await_duration=1)) as again:
        redelivered = receive(again, 5, 30)
        assert sorted(m.message_id for m in redelivered) == sorted(sent)
        for received in redelivered:
            again.ack(received)
    print("figures", json.dumps(figures))
