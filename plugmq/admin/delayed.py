"""The admin verbs on pending delayed messages: cancel one, or move it to another time.

A delayed message is named by the msg_id its send returned; ``plugmq serve`` hands official clients
a recall handle ``<msg_id>:<message id>``, which is accepted as well.
"""

from __future__ import annotations

import attrs

from plugmq.broker.ports import Administered
from plugmq.core.errors import ValidationError

__all__ = ["DelayedCancel", "DelayedMove", "cancel_delayed", "reschedule_delayed"]


@attrs.frozen
class DelayedCancel:
    """``cancelled``: the message will not be delivered; False when no pending message had that id."""

    msg_id: str
    cancelled: bool


@attrs.frozen
class DelayedMove:
    """``moved``: the message is now due at ``deliver_at_ms`` and named ``new_msg_id`` (the old id is
    spent); False when no pending message had that id (delivered, cancelled, moved, unknown)."""

    msg_id: str
    moved: bool
    deliver_at_ms: int
    new_msg_id: str | None


def _delay_id(text: str) -> str:
    msg_id = text.strip().partition(":")[0]  # a recall handle is <msg_id>:<message id>
    if not msg_id:
        raise ValidationError("a delayed message is named by the msg_id its send returned (or a recall handle); "
                              "got nothing")
    return msg_id


def cancel_delayed(broker: Administered, msg_id: str) -> DelayedCancel:
    ident = _delay_id(msg_id)
    return DelayedCancel(ident, broker.cancel_delayed(ident))


def reschedule_delayed(broker: Administered, msg_id: str, deliver_at_ms: int) -> DelayedMove:
    ident = _delay_id(msg_id)
    result = broker.reschedule_delayed(ident, deliver_at_ms)
    return DelayedMove(ident, result is not None, deliver_at_ms, None if result is None else result.msg_id)
