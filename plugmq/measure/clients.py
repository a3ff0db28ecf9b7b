"""The official RocketMQ 5 Python client (``rocketmq-python-client``, the 'serve' extra) as the
benchmarks and the served Spark replays drive it: configurations, producers, messages."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["client_config", "client_message", "producer", "simple_consumers"]


def client_config(address: str, timeout_s: float = 10) -> Any:
    """A ClientConfiguration for ``address`` without credentials."""
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(address, Credentials(), request_timeout=timeout_s)


def client_message(topic: str, body: bytes, *, tag: str | None = None,
                   properties: Mapping[str, str] | None = None) -> Any:
    """The client's Message: topic, body, tag and user properties."""
    from rocketmq import Message

    message = Message()
    message.topic = topic
    message.body = body
    if tag:
        message.tag = tag
    for key, value in (properties or {}).items():
        message.add_property(key, value)
    return message


@contextmanager
def producer(address: str, topics: Sequence[str], timeout_s: float = 10, *, tls: bool = False) -> Iterator[Any]:
    """A started Producer for ``topics`` (over TLS with ``tls``), shut down afterwards."""
    from rocketmq import Producer

    started = Producer(client_config(address, timeout_s), tuple(topics), tls_enable=tls)
    started.startup()
    try:
        yield started
    finally:
        started.shutdown()


@contextmanager
def simple_consumers(address: str, group: str, topic: str, count: int, *, await_s: float = 2,
                     timeout_s: float = 10) -> Iterator[list[Any]]:
    """``count`` started SimpleConsumers of ``group`` on ``topic`` (every message), shut down afterwards."""
    from rocketmq import FilterExpression, SimpleConsumer

    started: list[Any] = []
    try:
        for _ in range(count):
            consumer = SimpleConsumer(client_config(address, timeout_s), group, {topic: FilterExpression()},
                                      await_duration=await_s)
            consumer.startup()
            started.append(consumer)
        yield started
    finally:
        for consumer in started:
            consumer.shutdown()
