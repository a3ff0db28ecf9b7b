"""Open transactions and when each is next due for a check (or for the discard)."""

from __future__ import annotations

import heapq

__all__ = ["OpenTxn", "Schedule"]


class OpenTxn:
    """A half message without a decision. ``due_ms`` is its next check (or discard) time."""

    __slots__ = ("checks", "commit_log_offset", "due_ms", "group", "half", "size")

    def __init__(self, half: int, commit_log_offset: int, size: int, group: str, checks: int, due_ms: int) -> None:
        self.half = half
        self.commit_log_offset = commit_log_offset
        self.size = size
        self.group = group
        self.checks = checks
        self.due_ms = due_ms


class Schedule:
    """Open transactions by half offset and by commit-log offset, plus a heap of due times.

    Heap entries go stale when a transaction is settled or rescheduled; they are dropped when they
    reach the top (cheaper than removing them from the middle). Groups without a live checker
    park their due transactions in ``waiting`` until one registers.
    """

    def __init__(self) -> None:
        self.open: dict[int, OpenTxn] = {}
        self.by_offset: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self.waiting: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self.open)

    def add(self, txn: OpenTxn) -> None:
        self.open[txn.half] = txn
        self.by_offset[txn.commit_log_offset] = txn.half
        heapq.heappush(self._heap, (txn.due_ms, txn.half))

    def remove(self, half: int) -> OpenTxn | None:
        txn = self.open.pop(half, None)
        if txn is not None:
            self.by_offset.pop(txn.commit_log_offset, None)
            parked = self.waiting.get(txn.group)
            if parked is not None:
                parked.discard(half)
        return txn

    def reschedule(self, txn: OpenTxn, due_ms: int) -> None:
        txn.due_ms = due_ms
        heapq.heappush(self._heap, (due_ms, txn.half))

    def park(self, txn: OpenTxn) -> None:
        self.waiting.setdefault(txn.group, set()).add(txn.half)

    def unpark(self, group: str, now_ms: int) -> int:
        """Make a group's parked transactions due now; returns how many."""
        parked = self.waiting.pop(group, set())
        for half in parked:
            txn = self.open.get(half)
            if txn is not None:
                self.reschedule(txn, now_ms)
        return len(parked)

    def next_due(self) -> int | None:
        heap = self._heap
        while heap:
            due, half = heap[0]
            txn = self.open.get(half)
            if txn is not None and txn.due_ms == due and not self._is_parked(txn):
                return due
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int, limit: int) -> list[OpenTxn]:
        """Up to ``limit`` transactions due at ``now_ms``, earliest first; the caller reschedules,
        parks or settles each (until then they are off the heap)."""
        heap = self._heap
        due_now: dict[int, OpenTxn] = {}  # a half pushed twice with one due time is taken once
        while heap and heap[0][0] <= now_ms and len(due_now) < limit:
            due, half = heapq.heappop(heap)
            txn = self.open.get(half)
            if txn is not None and txn.due_ms == due and not self._is_parked(txn):
                due_now[half] = txn
        return list(due_now.values())

    def _is_parked(self, txn: OpenTxn) -> bool:
        parked = self.waiting.get(txn.group)
        return parked is not None and txn.half in parked
