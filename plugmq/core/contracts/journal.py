"""State journal: a stateful service's state as records in the commit log.

Not a hook family of its own: the broker hands a :class:`StateJournal` to the delay and
transaction services (``DelayContext.journal``, ``TransactionContext.journal``), so their state
follows the messages to a slave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from plugmq.core.message import (
    SendStatus,
)

__all__ = ["JournalReplay", "StateJournal"]


@attrs.frozen
class JournalReplay:
    """What :meth:`StateJournal.replay` found: the latest complete snapshot (None when the journal
    holds none) and the records written after it, oldest first."""

    snapshot: bytes | None
    records: tuple[bytes, ...]


@runtime_checkable
class StateJournal(Protocol):
    """A service's state as records of its own system topic in the store (``plugmq.broker.journal``).

    The broker hands one to each stateful service (``TransactionContext.journal``,
    ``DelayContext.journal``). The service keeps its state in memory, appends a record before a
    change takes effect, writes a snapshot of the whole state now and then (records before it are
    no longer replayed), and rebuilds at start from :meth:`replay`. Records travel to slaves with
    the messages, in one order, so a promoted slave replays the state its master had at the
    offset it holds, and a cut of the log (fencing) removes messages and state together.
    """

    @property
    def writable(self) -> bool:
        """False on a slave: the replication stream alone writes its store."""

    @property
    def bytes_since_snapshot(self) -> int:
        """Bytes of records written (or followed) since the latest snapshot."""

    def append(self, bodies: Sequence[bytes]) -> int:
        """Store records in one batch; returns the log offset past the last, for :meth:`settle`.
        ReadOnlyBrokerError where the journal is not writable."""

    def write_snapshot(self, data: bytes) -> int:
        """Store the whole state (the caller holds its lock: none of its records falls inside)."""

    def replay(self) -> JournalReplay:
        """The latest complete snapshot and the records after it."""

    def follow(self) -> list[bytes] | None:
        """Records stored since the last replay, follow or append (snapshots skipped); None when
        the log was cut below them, so the service must replay afresh."""

    def settle(self, end_offset: int) -> SendStatus:
        """On a ``sync_master``, wait until a slave holds the log up to ``end_offset``."""

    def snapshot_due(self) -> bool:
        """Whether the latest snapshot holds retention back so far that a new one is wanted."""

    def sync(self) -> None:
        """Make every record written so far durable (the store's flush), for services whose
        option asks for it beyond the store's flush mode."""
