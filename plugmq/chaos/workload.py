"""The load of a chaos run: producers and consumer groups of the official Python client
(``rocketmq-python-client``), every operation recorded in the run's history.

Producer threads share one ``Producer`` and send unique bodies (``p<thread>-<seq>``, padded
to ``body_bytes`` when asked), one at a time. Each consumer is a ``SimpleConsumer`` of its group that receives, records each delivery
(its queue and offset come from the receipt handle) and acks it. Every client is given all the
brokers' forwarders as endpoints, as an application is given its name servers.

No stop waits a fixed time: the consumers end once each finds nothing left after the producers
stopped, and the read-back once it holds every acknowledged body and its group has nothing left.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from plugmq.broker.pop import ReceiptHandle
from plugmq.chaos.history import Ack, Delivery, History, Readback, Receive, Send
from plugmq.core.errors import ReceiptHandleError

__all__ = ["TOPIC", "Workload", "drain"]

TOPIC = "ChaosTopic"
_REQUEST_TIMEOUT_S = 3
_INVISIBLE_S = 10
_FAILED_PAUSE_S = 0.05  # after a failed call, so a dead broker is not asked thousands of times a second
_DRAIN_FAILURES = 50  # failed calls the read-back survives (half a second apart)
_ACKERS = 8  # the read-back's acks in flight at once (one at a time, they were most of its time)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def _payload(name: str, size: int) -> bytes:
    """A message body: its unique name, padded with ``|xxx...`` up to ``size`` bytes."""
    encoded = name.encode()
    return encoded if size <= len(encoded) else encoded + b"|" + b"x" * (size - len(encoded) - 1)


def _name(received: Any) -> str:
    """The unique name a body starts with (what the history records, not the padding)."""
    return bytes(received.body).split(b"|", 1)[0].decode(errors="replace")


def _position(received: Any) -> tuple[int | None, int | None]:
    """(queue id, queue offset) of a delivery, from its receipt handle (None if it does not say)."""
    try:
        # The server seals the pop service's ``queue:offset:seq`` with a MAC after ``~``
        # (plugmq.server.receipts).
        handle = ReceiptHandle.parse(received.receipt_handle.split("~", 1)[0])
    except ReceiptHandleError:
        return None, None
    return handle.queue_id, handle.offset


def _configuration(endpoints: str) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(endpoints, Credentials(), request_timeout=_REQUEST_TIMEOUT_S)


class Workload:
    """``producers`` sending threads and ``groups`` x ``consumers`` receiving threads."""

    def __init__(self, endpoints: str, history: History, *, producers: int = 4, groups: int = 1,
                 consumers: int = 2, body_bytes: int = 0, names: dict[str, str] | None = None) -> None:
        self.endpoints = endpoints
        self.history = history
        self._names = names or {}  # endpoint -> the broker's name in the history
        self._body_bytes = body_bytes
        self._stop_sending = threading.Event()
        self._sent_all = threading.Event()  # every producer has returned from its last send
        self._stop_receiving = threading.Event()
        self._producer_count = producers
        self._group_names = [f"chaos-g{g + 1}" for g in range(groups)]
        self._consumer_count = consumers
        self._threads: list[threading.Thread] = []
        #: When the last send, and the last receive, that succeeded were invoked (history time).
        self.last_send_ok = float("-inf")
        self.last_receive_ok = float("-inf")
        self._producer: Any = None
        self._consumers: list[Any] = []

    def start(self) -> None:
        from rocketmq import FilterExpression, Producer, SimpleConsumer

        self._producer = Producer(_configuration(self.endpoints), (TOPIC,))
        self._producer.startup()
        for index in range(self._producer_count):
            self._spawn(self._send_loop, f"chaos-producer-{index}", f"p{index}")
        for group in self._group_names:
            for index in range(self._consumer_count):
                consumer = SimpleConsumer(_configuration(self.endpoints), group, {TOPIC: FilterExpression()},
                                          await_duration=1)
                consumer.startup()
                self._consumers.append(consumer)
                self._spawn(self._receive_loop, f"chaos-consumer-{group}-{index}", consumer, group,
                            f"{group}-c{index}")

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _send_loop(self, producer: str) -> None:
        from rocketmq import Message

        seq = 0
        while not self._stop_sending.is_set():
            body = f"{producer}-{seq}"
            message = Message()
            message.topic = TOPIC
            message.body = _payload(body, self._body_bytes)
            t0 = self.history.now()
            try:
                receipt = self._producer.send(message)
            except Exception as exc:  # noqa: BLE001 - a failed send is an outcome to record
                self.history.record(Send(t0, self.history.now(), producer, seq, body, False, error=_error(exc)))
                self._stop_sending.wait(_FAILED_PAUSE_S)
            else:
                self.last_send_ok = max(self.last_send_ok, t0)
                # The receipt's queue is the one the client addressed; the broker may store the message in
                # another of the topic's queues (its answer says the offset only): no queue recorded.
                self.history.record(Send(t0, self.history.now(), producer, seq, body, True, receipt.message_id,
                                         None, receipt.offset, broker=self._broker_of(receipt)))
            seq += 1

    def _broker_of(self, receipt: Any) -> str:
        """The broker a send went to: the endpoint of the queue the client addressed."""
        try:
            address = receipt.message_queue.message_queue0().broker.endpoints.addresses[0]
        except (AttributeError, IndexError):
            return ""
        endpoint = f"{address.host}:{address.port}"
        return self._names.get(endpoint, endpoint)

    def _receive_loop(self, consumer: Any, group: str, name: str) -> None:
        while not self._stop_receiving.is_set():
            t0 = self.history.now()
            after_the_sends = self._sent_all.is_set()
            try:
                batch = consumer.receive(16, _INVISIBLE_S)
            except Exception as exc:  # noqa: BLE001 - a failed receive is an outcome to record
                self.history.record(Receive(t0, self.history.now(), name, group, False, error=_error(exc)))
                self._stop_receiving.wait(_FAILED_PAUSE_S)
                continue
            t1 = self.history.now()
            self.last_receive_ok = max(self.last_receive_ok, t0)
            self.history.record(Receive(t0, t1, name, group, True, len(batch)))
            if not batch and after_the_sends:  # invoked once nothing more was sent: it took what was in flight
                return  # its thread ends: stop() waits for that
            for received in batch:
                body = _name(received)
                queue, offset = _position(received)
                self.history.record(Delivery(t0, t1, name, group, body, received.message_id, queue, offset,
                                             int(received.delivery_attempt or 0), str(received.endpoints or "")))
                a0 = self.history.now()
                try:
                    consumer.ack(received)
                except Exception as exc:  # noqa: BLE001 - a failed ack is an outcome to record
                    self.history.record(Ack(a0, self.history.now(), name, group, body, received.message_id, queue,
                                            offset, False, _error(exc)))
                else:
                    self.history.record(Ack(a0, self.history.now(), name, group, body, received.message_id, queue,
                                            offset, True))

    def served_since(self, t: float) -> bool:
        """A send and a receive invoked at ``t`` or later succeeded (the clients are back)."""
        return self.last_send_ok >= t and self.last_receive_ok >= t

    def stop(self, drain_s: float = 3.0) -> None:
        """Stop sending; let consumers run up to ``drain_s`` more (they take what is in flight, each
        until a receive invoked after the last send came back empty); stop them."""
        self._stop_sending.set()
        producers = [t for t in self._threads if t.name.startswith("chaos-producer")]
        for thread in producers:
            thread.join()
        self._sent_all.set()
        deadline = self.history.now() + drain_s  # a consumer's thread ends once it found nothing left
        for thread in self._threads:
            if thread not in producers:
                thread.join(max(0.0, deadline - self.history.now()))
        self._stop_receiving.set()
        for thread in self._threads:
            thread.join()
        for client in [self._producer, *self._consumers]:
            if client is not None:
                try:
                    client.shutdown()
                except Exception:  # noqa: BLE001 - a client that never connected may refuse to shut down
                    pass


def _acked(consumer: Any, received: Any) -> bool:
    """Ack one read-back message; False if the ack failed (it is read back all the same)."""
    try:
        consumer.ack(received)
    except Exception:  # noqa: BLE001 - it is received again after its invisible time, or not
        return False
    return True


def drain(endpoints: str, history: History, *, group: str = "chaos-readback", empty_polls: int = 3,
          wanted: AbstractSet[str] | None = None) -> int:
    """Read every message of the topic with a new group (from the start of each queue) and
    record each as a ``readback`` event.

    Stops after ``empty_polls`` empty receives in a row, or after one once every body of ``wanted``
    (the acknowledged sends) was read back: an empty receive pops the whole broker, so what else
    is stored (a failed send stored anyway, a second copy) was read by then too; the further
    empty polls are there for a body still missing, so that it is not reported lost too early."""
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(_configuration(endpoints), group, {TOPIC: FilterExpression()}, await_duration=1)
    consumer.startup()
    missing = None if wanted is None else set(wanted)  # None: not known, never complete
    count = empty = failed = 0
    acks: Iterator[bool] = iter(())  # the last batch's, acked while the next one is received
    try:
        with ThreadPoolExecutor(_ACKERS, thread_name_prefix="chaos-readback-ack") as ackers:
            while empty < (1 if missing is not None and not missing else empty_polls):
                try:
                    batch = consumer.receive(32, 60)
                except Exception:  # a broker between two roles: asked again, a bounded number of times
                    failed += 1
                    if failed > _DRAIN_FAILURES:
                        raise
                    threading.Event().wait(_FAILED_PAUSE_S * 10)
                    continue
                empty = 0 if batch else empty + 1
                for received in batch:
                    queue, offset = _position(received)
                    name = _name(received)
                    history.record(Readback(history.now(), name, received.message_id, queue, offset))
                    if missing is not None:
                        missing.discard(name)
                failed += sum(not ok for ok in acks)
                acks = ackers.map(_acked, [consumer] * len(batch), batch)
                count += len(batch)
            failed += sum(not ok for ok in acks)
    finally:
        consumer.shutdown()
    return count
