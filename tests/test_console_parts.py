"""The console's parts without a browser: brokers of a lone server, sessions, the sampled history, TLS files.

A real broker served on loopback (``ServerThread``) stands in for ``plugmq serve``; time is a
ManualClock where the parts take one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="needs the console extra (starlette, jinja2, uvicorn)")

from plugmq import ManualClock, Message
from plugmq.broker.broker import Broker
from plugmq.console.brokers import Credentials, Fleet, TlsFiles
from plugmq.console.history import History
from plugmq.console.sessions import Sessions, tokens_match
from plugmq.console.views import lag_chart, merged_trace
from plugmq.core.errors import ClientError, ConfigError
from plugmq.server import ServerOptions, ServerThread


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Broker, Fleet]]:
    with Broker.open(tmp_path / "data", plugins=["store_mmap", "filter_tag"]) as broker:
        broker.create_topic("Orders", 2)
        with ServerThread(broker, ServerOptions(long_polling_s=1.0)) as thread:
            made = Fleet([thread.server.address or ""])
            try:
                yield broker, made
            finally:
                made.close()


def test_a_lone_server_is_a_one_broker_fleet(fleet: tuple[Broker, Fleet]) -> None:
    _, made = fleet
    name, view, brokers = made.cluster(None)
    assert name is None and view is None
    assert [b.endpoint for b in brokers] == made.servers
    (call,) = made.each(brokers, "topic-status", {"topic": "Orders"}, None)
    assert call.error is None and len(call.result["queues"]) == 2
    (missing,) = made.each(brokers, "topic-status", {"topic": "Nope"}, None)
    assert missing.result is None and "does not exist" in (missing.error or "")


def test_the_history_samples_lag_per_queue_and_topic_rates(fleet: tuple[Broker, Fleet]) -> None:
    broker, made = fleet
    clock = ManualClock()
    signed_in: list[Credentials | None] = []
    history = History(made, clock, lambda: signed_in[0] if signed_in else False)
    assert not history.sample(), "nobody signed in: nothing is sampled"
    producer = broker.producer("shop")
    for i in range(4):
        producer.send(Message("Orders", f"order {i}".encode()))
    consumer = broker.simple_consumer("billing", {"Orders": "*"})
    consumer.ack(consumer.receive(1)[0])
    signed_in.append(None)
    assert history.sample()
    assert lag_chart(history, "billing") is None, "one sample is no chart"
    for i in range(6):
        producer.send(Message("Orders", f"more {i}".encode()))
    clock.advance(2)
    assert history.sample()
    series = history.lag_series("billing")
    assert sum(points[-1][1] for points in series.values()) == 9
    assert sum(points[0][1] for points in series.values()) == 3
    assert history.rate(made.servers[0], "Orders") == pytest.approx(3.0)
    chart = lag_chart(history, "billing")
    assert chart is not None and len(chart.lines) == 2 and chart.peak >= 4


def test_sessions_expire_and_tokens_compare_safely() -> None:
    clock = ManualClock()
    sessions = Sessions(clock, ttl_s=60)
    session = sessions.create(Credentials("ops", "s3cret"))
    assert "s3cret" not in repr(session.credentials)
    assert sessions.get(session.token) is session and sessions.latest() is session
    clock.advance(61)
    assert sessions.get(session.token) is None and sessions.latest() is None
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd")
    assert not tokens_match("", "") and not tokens_match(None, "abc")


def test_tls_files_must_be_readable_and_come_as_a_certificate_with_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both --tls-cert and --tls-key"):
        TlsFiles(tmp_path / "ca.pem", cert=tmp_path / "client.pem").credentials()
    with pytest.raises(ConfigError, match="cannot read a TLS file"):
        TlsFiles(tmp_path / "missing-ca.pem").credentials()


def test_a_trace_from_several_brokers_is_merged_in_time_order() -> None:
    from plugmq.console.brokers import Broker as Shown
    from plugmq.console.brokers import BrokerCall

    a, b = Shown("broker-a", 0, "master", "a:1"), Shown("broker-b", 0, "master", "b:1")
    calls = [BrokerCall(a, {"events": [{"at_ms": 5, "kind": "stored"}, {"at_ms": 9, "kind": "acked"}]}),
             BrokerCall(b, error="unreachable"),
             BrokerCall(b, {"events": [{"at_ms": 5, "kind": "delivered"}, {"at_ms": 7, "kind": "nacked"}]})]
    assert [e["kind"] for e in merged_trace(calls)] == ["stored", "delivered", "nacked", "acked"]


def test_sign_in_asks_the_next_server_when_one_cannot_be_reached(fleet: tuple[Broker, Fleet]) -> None:
    _, live = fleet
    with socket.socket() as closed:  # a port nobody listens on: bound, never listening
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
        both, alone = Fleet([dead, *live.servers], timeout_s=5), Fleet([dead], timeout_s=5)
        try:
            both.check(Credentials("ops", "secret"))  # the live server has no ACL: any account passes
            with pytest.raises(ClientError, match="cannot reach"):
                alone.check(Credentials("ops", "secret"))
        finally:
            both.close()
            alone.close()
