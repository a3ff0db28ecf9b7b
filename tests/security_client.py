"""The official rocketmq-python-client over TLS, as a child of the security tests.

``python security_client.py ADDRESS ACCESS_KEY SECRET TOPIC GROUP COUNT`` sends COUNT messages
with a Producer, receives and acks them with a SimpleConsumer of GROUP, all with ``tls_enable``,
and prints one JSON line: ``{"sent": [...], "received": [...]}`` (bodies). The client's TLS
channel trusts gRPC's default roots: the caller puts its CA in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH.
"""

from __future__ import annotations

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer


def main(address: str, access_key: str, secret: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(address, Credentials(access_key, secret), request_timeout=5)
    sent = [f"tls-{i}" for i in range(count)]
    producer = Producer(config, (topic,), tls_enable=True)
    producer.startup()
    try:
        for body in sent:
            message = Message()
            message.topic = topic
            message.body = body.encode()
            producer.send(message)
    finally:
        producer.shutdown()
    received: list[str] = []
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=1, tls_enable=True)
    consumer.startup()
    try:
        deadline = time.monotonic() + 30
        while len(received) < count and time.monotonic() < deadline:
            for message in consumer.receive(16, 30):
                consumer.ack(message)
                received.append(message.body.decode())
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "received": sorted(received)}))


if __name__ == "__main__":
    address, access_key, secret, topic, group, count = sys.argv[1:7]
    main(address, access_key, secret, topic, group, int(count))
