"""Transactional producers: ``broker.transaction_producer(group, local_transaction, check_listener)``.

RocketMQ's TransactionMQProducer: ``send_in_transaction`` stores a half message through the
broker's transaction plugin, runs the local transaction in the caller's thread and ends the
transaction with its decision. UNKNOWN (or an exception, or no decision at all) leaves the
message for the plugin's check-back, which asks ``check_listener`` of a live producer of the group.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import attrs

from plugmq.client.ports import TransactionSending
from plugmq.client.producer import QueueSelector, select_queue
from plugmq.core.contracts import (
    TransactionChecker,
    TransactionDecision,
    TransactionService,
)
from plugmq.core.errors import ClientError, TransactionError, ValidationError
from plugmq.core.logs import get_logger
from plugmq.core.message import (
    AppendStatus,
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
)
from plugmq.core.names import Prop, is_system_topic, validate_group

__all__ = ["LocalTransaction", "TransactionProducer", "TransactionSendResult"]

log = get_logger(__name__)

LocalTransaction = Callable[[Message, Any], TransactionDecision]
"""RocketMQ's executeLocalTransaction: (the message, the caller's arg) -> the local outcome."""



@attrs.frozen
class TransactionSendResult:
    """What ``send_in_transaction`` returns.

    ``send_result.queue`` is the real queue the message lands on when committed, ``msg_id`` and
    ``transaction_id`` name the half message (what the check listener sees as ``msg_id`` and
    what ``broker.transactions.end`` takes). ``local_decision`` is what the local transaction
    said (UNKNOWN when it raised: ``local_error`` holds the exception text). ``applied`` is
    whether that decision ended the transaction now (False for UNKNOWN).
    """

    send_result: SendResult
    local_decision: TransactionDecision
    applied: bool
    local_error: str | None = None

    @property
    def transaction_id(self) -> str:
        assert self.send_result.transaction_id is not None
        return self.send_result.transaction_id

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id

    @property
    def unique_id(self) -> str:
        return self.send_result.unique_id


class TransactionProducer:
    """Sends transactional messages for one producer group; its check listener stays registered
    (and answers check-backs) until ``close()``. Thread-safe."""

    def __init__(self, broker: TransactionSending, group: str, local_transaction: LocalTransaction,
                 check_listener: TransactionChecker) -> None:
        service: TransactionService | None = broker.transactions
        if service is None:
            raise TransactionError(
                f"broker {broker.name!r} has no transaction plugin; add 'txn' to broker.plugins "
                "to send transactional messages"
            )
        if not callable(local_transaction) or not callable(check_listener):
            raise ValidationError("local_transaction and check_listener must both be callables")
        self.broker = broker
        self.group = validate_group(group)
        self.service = service
        self._local = local_transaction
        self._checker = check_listener
        self._counter = itertools.count()
        self._closed = False
        self._lock = threading.Lock()
        service.register_checker(self.group, check_listener)

    def send_in_transaction(self, message: Message, arg: Any = None, *, selector: QueueSelector | None = None,
                            check_immunity_s: int | None = None) -> TransactionSendResult:
        """Store ``message`` as a half message, run the local transaction, end it with its decision.

        ``check_immunity_s``: no check-back for this message before that many seconds after it was
        stored (instead of the broker's transaction timeout); waiting out immunity counts no check.
        """
        if self._closed:
            raise ClientError(f"transaction producer of group {self.group!r} is closed")
        if message.is_delayed and not self.service.capabilities.delayed_transactions:
            raise TransactionError(
                f"message to {message.topic!r} is delayed; the transaction plugin does not support delayed "
                "transactional messages (RocketMQ's combination floods the half topic, #1540). Send it "
                "without a delay, or commit first and send a delayed follow-up"
            )
        if is_system_topic(message.topic):
            raise TransactionError(f"topic {message.topic!r} is a system topic; producers may not send to it")
        extra: dict[str, str] = {}
        if check_immunity_s is not None:
            if isinstance(check_immunity_s, bool) or not isinstance(check_immunity_s, int) or check_immunity_s < 0:
                raise ValidationError(f"check_immunity_s must be a whole number of seconds >= 0, got {check_immunity_s!r}")
            extra[Prop.CHECK_IMMUNITY_SECONDS] = str(check_immunity_s)
        if message.delay_level is not None:
            extra[Prop.DELAY_LEVEL] = str(message.delay_level)
        elif message.deliver_at_ms is not None:
            extra[Prop.DELIVER_AT_MS] = str(message.deliver_at_ms)
        queue = self._choose(message, selector, arg)
        request = self.broker.build_request(message, queue.queue_id, extra_properties=extra)
        stored = self.service.prepare(request, self.group)
        send = SendResult(
            status=SendStatus.SEND_OK if stored.status is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT,
            msg_id=stored.msg_id, unique_id=request.properties[Prop.UNIQ_KEY], queue=queue,
            queue_offset=stored.queue_offset, transaction_id=stored.msg_id,
        )
        decision, error = self._run_local(message, arg, stored.msg_id)
        applied = False
        if decision is not TransactionDecision.UNKNOWN:
            applied = self.service.end(stored.msg_id, decision)
        return TransactionSendResult(send_result=send, local_decision=decision, applied=applied, local_error=error)

    def _run_local(self, message: Message, arg: Any, transaction_id: str) -> tuple[TransactionDecision, str | None]:
        try:
            decision = self._local(message, arg)
        except Exception as exc:  # noqa: BLE001 - user code; the half is stored, the check-back settles it
            log.warning("local transaction raised; left for check-back", group=self.group,
                        transaction_id=transaction_id, error=repr(exc))
            return TransactionDecision.UNKNOWN, repr(exc)
        if not isinstance(decision, TransactionDecision):
            log.warning("local transaction returned no TransactionDecision; left for check-back",
                        group=self.group, transaction_id=transaction_id, returned=repr(decision))
            return TransactionDecision.UNKNOWN, None
        return decision, None

    def _choose(self, message: Message, selector: QueueSelector | None, arg: Any) -> MessageQueue:
        return select_queue(self.broker.topic_queues(message.topic), message, selector, arg, self._counter)

    def close(self) -> None:
        """Stop answering check-backs for the group (from this producer)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.service.unregister_checker(self.group, self._checker)

    def __enter__(self) -> TransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
