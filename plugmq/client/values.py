"""Values clients receive from a broker (beside those of ``plugmq.core.message``)."""

from __future__ import annotations

import threading

import attrs

from plugmq.core.message import StoredMessage
from plugmq.core.names import Prop

__all__ = ["PendingReply", "ReceivedMessage"]

_STORED_FIELDS = tuple(field.name for field in attrs.fields(StoredMessage))


@attrs.frozen
class ReceivedMessage(StoredMessage):
    """A message as a pop consumer receives it: the stored message plus this delivery.

    ``receipt_handle`` names this delivery (ack it, or change its invisible duration, with it);
    ``delivery_attempt`` counts deliveries to the group (1 = first); ``invisible_duration_ms`` is
    how long the message stays invisible to the group after this delivery started;
    ``consumer_group`` is the group it was delivered to.
    """

    receipt_handle: str = attrs.field(kw_only=True)
    delivery_attempt: int = attrs.field(kw_only=True)
    invisible_duration_ms: int = attrs.field(kw_only=True)
    consumer_group: str = attrs.field(kw_only=True)

    @classmethod
    def of(cls, message: StoredMessage, *, receipt_handle: str, delivery_attempt: int,
           invisible_duration_ms: int, consumer_group: str) -> ReceivedMessage:
        fields = {name: getattr(message, name) for name in _STORED_FIELDS}
        return cls(**fields, receipt_handle=receipt_handle, delivery_attempt=delivery_attempt,
                   invisible_duration_ms=invisible_duration_ms, consumer_group=consumer_group)

    @property
    def message_group(self) -> str | None:
        """The FIFO message group the producer gave (``None`` for a normal message)."""
        return self.properties.get(Prop.SHARDING_KEY)


class PendingReply:
    """A request's wait for its reply (``Producer.request``): ``done`` is set once the reply is stored."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: StoredMessage | None = None
