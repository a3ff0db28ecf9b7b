"""An authenticated cluster with real processes: two failover ``plugmq serve`` brokers sharing a
cluster secret on a real ZooKeeper, and the official Python client.

A receipt handle given out by the master is sealed with a key derived from the cluster secret and
the broker name, so the slave elected after the master is killed accepts the ack of a message
received before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.testing import ZooKeeperServer, wait_for
from tests.fault_harness import GROUP, TOPIC, running_pair

WAIT_S = 40.0


def make_secret(directory: Path) -> Path:
    path = directory / "cluster.secret"
    path.write_text("0123456789abcdef" * 3 + "\n")
    path.chmod(0o600)
    return path


def test_an_ack_after_failover_is_taken_by_the_new_master(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    with running_pair(tmp_path, zookeeper, mode="sync_master", secret=make_secret(tmp_path)) as pair:
        first = pair.master()
        producer = Producer(ClientConfiguration(pair.endpoints(), Credentials(), request_timeout=3), (TOPIC,))
        consumer = SimpleConsumer(ClientConfiguration(pair.endpoints(), Credentials(), request_timeout=4), GROUP,
                                  {TOPIC: FilterExpression()}, await_duration=1)
        producer.startup()
        consumer.startup()
        try:
            message = Message()
            message.topic, message.body = TOPIC, b"acked across a failover"
            producer.send(message)
            got = wait_for(lambda: consumer.receive(1, 120), WAIT_S, "the message to be received")
            received = got[0]
            assert bytes(received.body) == b"acked across a failover"
            pair.kill(first)
            other = 1 - first
            wait_for(lambda: (pair.status(other) or {}).get("role"), WAIT_S, "the slave to be elected",
                     until=lambda role: role not in (None, "slave"))
            failures: list[str] = []

            def acked() -> bool:
                try:
                    consumer.ack(received)
                except Exception as exc:  # noqa: BLE001 - routes move: a failed ack is retried, and kept
                    failures.append(f"{type(exc).__name__}: {exc}"[:300])
                    return False
                return True

            wait_for(acked, WAIT_S, "the ack to be taken by the new master")
            assert not [f for f in failures if "RECEIPT" in f.upper()], failures
        finally:
            consumer.shutdown()
            producer.shutdown()
