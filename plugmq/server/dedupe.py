"""A client's retry of a send this broker already stored is answered, not stored a second time.

The official clients retry a failed or timed-out send at once with the same message id. When the
first try was stored but not confirmed in time (a slave slow to confirm, an answer lost with a
frozen or dying master), the retry would store the message twice. So the broker remembers the
message ids it stored lately (:class:`RecentSends`), and for a while after it became master it
also looks a message id up in the store's key index, where the old master's stores it holds are
(the unique id is a key): a retry found either way is answered with the stored message's offset
once the round's replication wait covers it.

A retry that arrives after both windows, or lands on a broker whose store does not index unique
ids, is stored again (at-least-once sending, as RocketMQ).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from plugmq.core.clock import Clock
from plugmq.core.message import StoredMessage

__all__ = ["RecentSends"]

#: How many stored sends are remembered (a retry comes within a few request timeouts).
REMEMBERED = 65536
#: How long after becoming master this broker looks retried sends up in its store (the official
#: clients retry at once, three tries of a request timeout each).
AFTER_PROMOTION_S = 10.0
#: How far back that lookup reaches (store time).
LOOKBACK_MS = 60_000


class RecentSends:
    """The message ids this broker stored lately, and a store lookup after a promotion. Thread-safe.

    What a retry is answered with is its first try's queue offset (the entry's status is the
    round's): one integer remembered per send, no result object kept alive.

    The ids are kept in two generations of plain dicts: a batch of ids goes into the newer one in
    one update; when that holds ``remembered`` ids it becomes the older one and the oldest
    generation is dropped whole. So the last ``remembered`` sends (up to twice that many) are
    always remembered, with no eviction step per message."""

    def __init__(self, clock: Clock, promoted_at: Callable[[], float | None],
                 lookup: Callable[[str, str, int], StoredMessage | None], remembered: int = REMEMBERED) -> None:
        self._clock = clock
        self._promoted_at = promoted_at
        self._lookup = lookup
        self._remembered = remembered
        self._lock = threading.Lock()
        self._sent: dict[str, int] = {}  # the newer generation
        self._older: dict[str, int] = {}

    def stored_many(self, message_ids: Iterable[str], queue_offsets: Iterable[int]) -> None:
        """Sends were stored (whatever their replication status said), at these queue offsets."""
        with self._lock:
            sent = self._sent
            sent.update(zip(message_ids, queue_offsets))
            if len(sent) >= self._remembered:
                self._older, self._sent = sent, {}

    def may_know(self, message_ids: Iterable[str]) -> bool:
        """Whether :meth:`find` may answer one of ``message_ids`` with an offset (one is remembered,
        or the store is looked up after a promotion); False: it answers None for each of them.
        ``message_ids`` is read twice (a list, not an iterator)."""
        if self._promotion_window_open():
            return True
        with self._lock:
            return not (self._sent.keys().isdisjoint(message_ids) and self._older.keys().isdisjoint(message_ids))

    def _promotion_window_open(self) -> bool:
        promoted = self._promoted_at()
        return promoted is not None and self._clock.monotonic() - promoted <= AFTER_PROMOTION_S

    def find(self, message_id: str, topic: str) -> int | None:
        """The queue offset of the stored send this one retries; None when it is new."""
        with self._lock:
            known = self._sent.get(message_id)
            if known is None:
                known = self._older.get(message_id)
        if known is not None:
            return known
        if not self._promotion_window_open():
            return None
        since_ms = self._clock.now_ms() - LOOKBACK_MS
        stored = self._lookup(topic, message_id, since_ms)
        return None if stored is None else stored.queue_offset
