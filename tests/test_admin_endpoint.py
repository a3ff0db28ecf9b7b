"""The admin endpoint and the metrics endpoint of a server in this process (ManualClock): access
control for admin calls, error codes, metrics from the delay plugin and the store, config errors."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
pytest.importorskip("prometheus_client", reason="needs the serve extra (prometheus_client)")

from prometheus_client.parser import text_string_to_metric_families

from plugmq import Broker, ManualClock, Message
from plugmq.core.errors import ClientError, ConfigError, TopicError, ValidationError
from plugmq.server import ServerThread, parse_server_table
from plugmq.server.admin import AdminClient
from plugmq.testing import wait_for
from tests.helpers.services import delay_of

ACL = {"enabled": True, "accounts": {
    "ops": {"secret": "ops-secret", "admin": True},
    "app": {"secret": "app-secret", "publish": ["*"], "subscribe": ["*"]},
}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Broker, str, str]]:
    clock = ManualClock(start=time.time())
    broker = Broker.open(tmp_path / "data", clock=clock, plugins=["store_mmap", "delay_wheel", "filter_tag"])
    options = parse_server_table({"long_polling_s": 0.5, "metrics_listen": "127.0.0.1:0", "acl": ACL})
    thread = ServerThread(broker, options)
    try:
        address = thread.start()
        metrics = thread.server.metrics
        assert metrics is not None
        yield broker, address, f"http://{metrics.address}/metrics"
    finally:
        thread.stop()
        broker.close()


def scrape(url: str) -> dict[str, list[Any]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_admin_calls_need_an_admin_account_when_access_control_is_on(served: tuple[Broker, str, str]) -> None:
    broker, address, _ = served
    broker.create_topic("Orders", 2)
    with AdminClient(address) as anonymous, pytest.raises(ClientError, match="carries no signature"):
        anonymous.call("topic-list", {})
    with AdminClient(address, access_key="app", secret_key="app-secret") as app, \
            pytest.raises(ClientError, match="'app' may not administer this broker; set admin = true"):
        app.call("topic-list", {})
    with AdminClient(address, access_key="ops", secret_key="wrong") as forged, \
            pytest.raises(ClientError, match="does not match"):
        forged.call("topic-list", {})
    with AdminClient(address, access_key="ops", secret_key="ops-secret") as ops:
        assert [t["topic"] for t in ops.call("topic-list", {})] == ["Orders"]
        with pytest.raises(ValidationError, match="never shrinks"):
            ops.call("update-topic", {"topic": "Orders", "queue_count": 1})
        with pytest.raises(TopicError, match="does not exist"):
            ops.call("topic-status", {"topic": "Nope"})
        with pytest.raises(ValidationError, match="unknown argument"):
            ops.call("topic-status", {"topic": "Orders", "extra": 1})
        with pytest.raises(ClientError, match="this broker is not in a cluster"):
            ops.call("cluster-list", {})


def test_unreachable_server_is_one_clear_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with AdminClient(f"127.0.0.1:{port}", timeout_s=5) as client, \
            pytest.raises(ClientError, match=f"cannot reach plugmq serve at 127.0.0.1:{port}"):
        client.call("topic-list", {})
    with pytest.raises(ValidationError, match="both an access key and a secret key"):
        AdminClient("127.0.0.1:1", access_key="ops")


def test_metrics_cover_traffic_delay_store_and_process(served: tuple[Broker, str, str]) -> None:
    broker, _, url = served
    broker.create_topic("Orders", 1)
    now = broker.clock.now_ms()
    for i in range(3):
        broker.put(Message("Orders", b"x" * 10, deliver_at_ms=now + 5000 + i), 0)
    broker.put(Message("Orders", b"y" * 20), 0)
    before = scrape(url)
    assert before["rocketmq_timing_messages"] == [({}, 3.0)]
    assert ({"topic": "Orders", "message_type": "delay"}, 3.0) in before["rocketmq_messages_in_total"]
    assert ({"topic": "Orders", "message_type": "normal"}, 20.0) in before["rocketmq_throughput_in_total"]
    broker.clock.advance(7)  # type: ignore[attr-defined]
    # the delay plugin's dispatch thread catches up with the advanced clock
    wait_for(delay_of(broker).pending, 10, "the due delayed messages dispatched", until=lambda pending: pending == 0)
    after = scrape(url)
    assert after["rocketmq_timing_messages"] == [({}, 0.0)]
    quantiles = {labels["quantile"]: value for labels, value in after["plugmq_delay_lateness_milliseconds"]}
    assert set(quantiles) == {"0.5", "0.99", "1"} and 0 <= quantiles["0.5"] <= quantiles["1"] <= 2000
    assert after["plugmq_delay_pending"] == [({}, 0.0)]  # every figure of delay.metrics(), prefixed
    buckets = {labels["le"]: value for labels, value in after["plugmq_store_append_latency_seconds_bucket"]}
    assert buckets["+Inf"] == 4.0  # one normal send + three delayed messages written back when due
    assert after["plugmq_store_messages_appended"][0][1] >= 4
    assert after["plugmq_disk_free_bytes"][0][1] > 0 and after["rocketmq_storage_size"][0][1] > 0
    assert after["process_cpu_seconds_total"][0][1] > 0
    assert after["plugmq_broker_info"] == [({"broker": "broker-a", "role": "standalone"}, 1.0)]


def test_metrics_and_admin_config_errors() -> None:
    with pytest.raises(ConfigError, match="metrics_listen must be 'host:port'"):
        parse_server_table({"metrics_listen": "nowhere"})
    with pytest.raises(ConfigError, match="accounts.ops.admin must be true or false"):
        parse_server_table({"acl": {"enabled": True, "accounts": {"ops": {"secret": "s", "admin": "yes"}}}})


def test_a_taken_metrics_port_is_a_config_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with Broker.open(tmp_path / "data", plugins=["store_mmap"]) as broker:
            thread = ServerThread(broker, parse_server_table({"metrics_listen": f"127.0.0.1:{port}"}))
            try:
                with pytest.raises(ConfigError, match=f"cannot serve metrics on '127.0.0.1:{port}'"):
                    thread.start()
            finally:
                thread.stop()
