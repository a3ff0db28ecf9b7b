"""Leader/follower group commit: concurrent appends share one engine transaction.

Each caller queues its batch, then takes the write lock. Whoever gets it first (the leader) takes
every queued batch and commits them in one transaction; the others find theirs already done when
they get the lock. With sync flush, N concurrent writers thus pay for one fsync, not N, and
offsets are assigned in one place, in queue order. No extra thread: a lone writer commits its
own batch at once.

store_lmdb and store_rocks each keep an identical copy of this module: plugins may not
import each other.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, Sequence, TypeVar

import attrs

T = TypeVar("T")
R = TypeVar("R")


@attrs.define(eq=False)
class _Ticket(Generic[T, R]):
    items: Sequence[T]
    results: list[R] | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``commit(batches) -> results per batch`` runs under the write lock, one call per group.

    If it raises, every batch of that group fails with the exception and nothing of the group
    may have been written (the commit function's duty: one engine transaction).
    """

    def __init__(self, commit: Callable[[list[Sequence[T]]], list[list[R]]]) -> None:
        self._commit = commit
        self._queue_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._queue: list[_Ticket[T, R]] = []
        self.groups = 0

    def submit(self, items: Sequence[T]) -> list[R]:
        ticket: _Ticket[T, R] = _Ticket(items)
        with self._queue_lock:
            self._queue.append(ticket)
        with self._write_lock:
            if ticket.results is None and ticket.error is None:
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self.groups += 1
                try:
                    outcome = self._commit([t.items for t in group])
                except BaseException as exc:  # every waiter of the group must hear of it
                    for t in group:
                        t.error = exc
                else:
                    for t, results in zip(group, outcome, strict=True):
                        t.results = results
        if ticket.error is not None:
            raise ticket.error
        assert ticket.results is not None
        return ticket.results

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off appends (retention, recovery, map growth from outside a commit)."""
        with self._write_lock:
            yield
