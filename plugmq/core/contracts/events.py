"""Events: what the broker hands its observers (the ``plugmq_broker_started`` ... hooks).

Observers return nothing; the one component they get is a :class:`SystemTopicWriter`, through
which an observer (the trace plugin) keeps its own records in the broker's store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["SystemTopicWriter"]


@runtime_checkable
class SystemTopicWriter(Protocol):
    """What an observer plugin may write: its own records on a system topic of the broker.

    Handed to ``plugmq_broker_started``. ``append_system_records`` stores each body as one message of
    ``topic`` (queue 0, created when missing), with ``keys`` (white-space free) indexed so a
    query by key finds it, in one store batch. No event hook fires for these records (an observer
    writing what it observes would observe itself). Raises a PlugmqError when the broker cannot
    write (a slave, a full disk, a closed broker): the caller decides whether to drop or retry.
    """

    def append_system_records(self, topic: str, records: Sequence[tuple[bytes, Sequence[str]]]) -> int:
        """Store ``(body, keys)`` records on system topic ``topic``; returns how many were stored."""
        ...
