"""Leader/follower group commit: concurrent appends share one engine transaction.

Each caller queues its batch. If no commit is running, the caller becomes the leader: it takes
every queued batch and commits them in one transaction, outside the queue lock, so more batches
queue up meanwhile; the others wait on a condition and wake when their batch is done (or lead
the next group). With sync flush, N concurrent writers thus pay for one fsync, not N, and
offsets are assigned in one place, in queue order. No extra thread: a lone writer commits its
own batch at once.

Shared by store_lmdb and store_rocks (plugins may not import each other, so it lives in the core).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

import attrs

T = TypeVar("T")
R = TypeVar("R")


@attrs.define(eq=False)
class _Ticket(Generic[T, R]):
    items: Sequence[T]
    done: bool = False
    results: list[R] | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``commit(batches) -> results per batch`` runs for one group at a time.

    If it raises, every batch of that group fails with the exception and nothing of the group
    may have been written (the commit function's duty: one engine transaction).
    """

    def __init__(self, commit: Callable[[list[Sequence[T]]], list[list[R]]]) -> None:
        self._commit = commit
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Ticket[T, R]] = []
        self._busy = False  # a leader is committing (or someone holds ``exclusive``)
        self.groups = 0

    def submit(self, items: Sequence[T]) -> list[R]:
        ticket: _Ticket[T, R] = _Ticket(items)
        with self._cond:
            self._queue.append(ticket)
            while not ticket.done and self._busy:
                self._cond.wait()
            if ticket.done:
                return self._outcome(ticket)
            self._busy = True
            group, self._queue = self._queue, []
            self.groups += 1
        try:
            outcome = self._commit([t.items for t in group])
        except BaseException as exc:  # noqa: BLE001 - every waiter of the group must hear of it
            for t in group:
                t.error = exc
        else:
            for t, results in zip(group, outcome, strict=True):
                t.results = results
        finally:
            with self._cond:
                for t in group:
                    t.done = True
                self._busy = False
                self._cond.notify_all()
        return self._outcome(ticket)

    @staticmethod
    def _outcome(ticket: _Ticket[T, R]) -> list[R]:
        if ticket.error is not None:
            raise ticket.error
        assert ticket.results is not None
        return ticket.results

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off commits (retention, recovery, close); queued batches wait until released."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
