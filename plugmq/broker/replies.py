"""Request-reply over the broker (RocketMQ 4.6): requests waiting for their replies, by correlation id.

A requester (``Producer.request``) sends its request with a correlation id and waits here; a
consumer answers with ``Producer.reply``, which stores the reply on the reply topic
(``<cluster or broker name>_REPLY_TOPIC``) with the same correlation id. When the reply is stored,
the waiting request gets it at once (RocketMQ pushes replies to the requesting client); a reply
that finds nobody waiting (the request timed out) stays on the reply topic, like any message.
The send path asks one attribute per send (``waiting``) while no request waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from plugmq.client.values import PendingReply
from plugmq.core.message import AppendRequest, AppendResult, StoredMessage
from plugmq.core.names import REPLY_MESSAGE, Prop

__all__ = ["Replies"]


class Replies:
    """Thread-safe table of the requests waiting for a reply."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, PendingReply] = {}
        self.waiting = False  # read without the lock on every send: a stale True costs one lookup

    def expect(self, correlation_id: str) -> PendingReply:
        pending = PendingReply()
        with self._lock:
            self._pending[correlation_id] = pending
            self.waiting = True
        return pending

    def forget(self, correlation_id: str) -> None:
        with self._lock:
            self._pending.pop(correlation_id, None)
            self.waiting = bool(self._pending)

    def stored(self, result: AppendResult, request: AppendRequest, read: Callable[[int, int], StoredMessage | None]
               ) -> None:
        """A message was stored: if it is a reply someone waits for, hand it over."""
        if request.properties.get(Prop.MESSAGE_TYPE) != REPLY_MESSAGE:
            return
        correlation_id = request.properties.get(Prop.CORRELATION_ID, "")
        with self._lock:
            pending = self._pending.pop(correlation_id, None)
            self.waiting = bool(self._pending)
        if pending is not None:
            pending.reply = read(result.commit_log_offset, result.size)
            pending.done.set()
