"""Half messages and what becomes of them: the request rewrites of RocketMQ's transactional bridge.

A half message is the producer's request stored under ``TRANS_HALF_TOPIC`` queue 0 with its real
topic and queue in ``REAL_TOPIC`` / ``REAL_QID`` and its producer group in ``PGROUP``: consumers
never read that topic, so it is invisible. A commit writes a copy to the real queue; a discard
writes one to ``TRANS_DISCARD_TOPIC`` with the real topic kept, so an operator can resend it.
"""

from __future__ import annotations

import attrs

from plugmq.core import AppendRequest, Prop, StoredMessage, TransactionError
from plugmq.core.message import SysFlag
from plugmq.core.names import TRANS_DISCARD_TOPIC, TRANS_HALF_TOPIC, is_system_topic

__all__ = [
    "checker_view",
    "commit_request",
    "discard_request",
    "half_request",
    "immunity_ms",
    "real_queue",
    "unique_id",
]

HALF_QUEUE = 0
DISCARD_QUEUE = 0
# Transaction-only bookkeeping a consumer of the committed message has no use for.
_HALF_ONLY = (Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID, Prop.CHECK_IMMUNITY_SECONDS, Prop.TRANSACTION_CHECK_TIMES)


def immunity_ms(properties: object) -> int | None:
    """The message's check-immunity time in ms, None when it has none; TransactionError if bad."""
    raw = properties.get(Prop.CHECK_IMMUNITY_SECONDS)  # type: ignore[attr-defined]
    if raw is None:
        return None
    try:
        seconds = int(raw)
    except ValueError:
        seconds = -1
    if seconds < 0:
        raise TransactionError(
            f"check immunity {raw!r} is not a whole number of seconds >= 0; pass check_immunity_s=<int>"
        )
    return seconds * 1000


def half_request(request: AppendRequest, producer_group: str) -> AppendRequest:
    """The half message for ``request``; refuses what a transaction cannot carry."""
    if Prop.DELAY_LEVEL in request.properties or Prop.DELIVER_AT_MS in request.properties:
        raise TransactionError(
            f"message to {request.topic!r} is delayed; transactional messages cannot be delayed "
            "(RocketMQ's combination floods the half topic, #1540): send it without a delay, or "
            "commit first and send a delayed follow-up"
        )
    if is_system_topic(request.topic):
        raise TransactionError(f"topic {request.topic!r} is a system topic; transactions may not write to it")
    immunity_ms(request.properties)
    props = dict(request.properties)
    props[Prop.REAL_TOPIC] = request.topic
    props[Prop.REAL_QUEUE_ID] = str(request.queue_id)
    props[Prop.TRANSACTION_PREPARED] = "true"
    props[Prop.PRODUCER_GROUP] = producer_group
    return attrs.evolve(request, topic=TRANS_HALF_TOPIC, queue_id=HALF_QUEUE, properties=props,
                        sys_flag=request.sys_flag | SysFlag.TRANSACTION_PREPARED)


def real_queue(half: StoredMessage) -> tuple[str, int]:
    try:
        return half.properties[Prop.REAL_TOPIC], int(half.properties[Prop.REAL_QUEUE_ID])
    except (KeyError, ValueError) as exc:
        raise TransactionError(
            f"half message {half.msg_id} has no valid {Prop.REAL_TOPIC}/{Prop.REAL_QUEUE_ID}; it was not "
            "written by a transaction service"
        ) from exc


def unique_id(half: StoredMessage) -> str | None:
    return half.properties.get(Prop.UNIQ_KEY)


def _copy(half: StoredMessage, topic: str, queue_id: int, properties: dict[str, str], sys_flag: int) -> AppendRequest:
    return AppendRequest(
        topic=topic, queue_id=queue_id, body=half.body, properties=properties, tags_code=half.tags_code,
        born_timestamp_ms=half.born_timestamp_ms, born_host=half.born_host,
        reconsume_times=half.reconsume_times, sys_flag=sys_flag,
        prepared_transaction_offset=half.commit_log_offset,
    )


def commit_request(half: StoredMessage) -> AppendRequest:
    """The committed message: the half's body and properties on its real topic and queue."""
    topic, queue_id = real_queue(half)
    props = {k: v for k, v in half.properties.items() if k not in _HALF_ONLY}
    flag = (half.sys_flag & ~int(SysFlag.TRANSACTION_ROLLBACK)) | SysFlag.TRANSACTION_COMMIT
    return _copy(half, topic, queue_id, props, flag)


def discard_request(half: StoredMessage, checks: int) -> AppendRequest:
    """The discarded message: kept whole (real topic/queue included) on the discard topic."""
    props = dict(half.properties)
    props[Prop.TRANSACTION_CHECK_TIMES] = str(checks)
    return _copy(half, TRANS_DISCARD_TOPIC, DISCARD_QUEUE, props, half.sys_flag)


def checker_view(half: StoredMessage) -> StoredMessage:
    """What a check listener sees: the half on its real topic/queue; ``msg_id`` is the transaction id."""
    topic, queue_id = real_queue(half)
    return attrs.evolve(half, topic=topic, queue_id=queue_id)
