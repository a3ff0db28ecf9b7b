"""The in-memory hashed wheel (QMQ's ``HashedWheelTimer`` driven by ``WheelTickManager``).

Slots form a ring of ``slots`` buckets of ``tick_ms`` each; an entry lives in slot
``tick % slots`` where ``tick = ceil(deliver_at / tick_ms)``, so it fires at the first tick
boundary at or after its deliver time (never early, at most one tick late). A slot also holds
entries for later turns of the ring (QMQ's ``remainingRounds``); expiring a slot keeps those.

Unlike Netty's worker, nothing ticks through empty slots: a min-heap of the absolute tick
numbers that hold entries tells the scheduler when to wake next (one clock timer).

The wheel holds only the index (deliver time, sequence, segment, position); the record is read
from the schedule segment when it fires.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from plugmq.plugins.delay_schedule.schedule_log import Segment

__all__ = ["HashedWheel", "WheelEntry"]


class WheelEntry(NamedTuple):
    """Sorts by deliver time, then sequence (insertion order for ties; sequences are unique).

    ``segment`` is the segment object, not its bucket start: a retired bucket can be re-created
    by a late message, and an entry of the old segment must not be read from the new one."""

    deliver_at_ms: int
    seq: int
    segment: Segment
    position: int  # of the record in that segment
    size: int  # of the record, so delivery reads it with one pread


class HashedWheel:
    def __init__(self, *, tick_ms: int, slots: int) -> None:
        self.tick_ms = tick_ms
        self._mask = slots - 1
        self._slots: list[list[tuple[int, WheelEntry]]] = [[] for _ in range(slots)]
        self._ticks: list[int] = []  # heap of ticks with entries
        self._queued: set[int] = set()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def tick_of(self, when_ms: int) -> int:
        return -(-when_ms // self.tick_ms)

    def add(self, entry: WheelEntry) -> bool:
        """Insert; True when the entry's tick is now the earliest (the wake-up must move)."""
        tick = self.tick_of(entry.deliver_at_ms)
        self._slots[tick & self._mask].append((tick, entry))
        self._size += 1
        earliest = not self._ticks or tick < self._ticks[0]
        if tick not in self._queued:
            self._queued.add(tick)
            heapq.heappush(self._ticks, tick)
        return earliest

    def next_tick(self) -> int | None:
        return self._ticks[0] if self._ticks else None

    def pop_due(self, tick: int, limit: int | None = None) -> list[WheelEntry]:
        """Remove and return entries whose tick is <= ``tick``, oldest deliver time first.

        With ``limit``, stop after the earliest ticks that together reach it (a tick is never
        split, so ordering within it stays total)."""
        due: list[WheelEntry] = []
        while self._ticks and self._ticks[0] <= tick and (limit is None or len(due) < limit):
            current = heapq.heappop(self._ticks)
            self._queued.discard(current)
            slot_index = current & self._mask
            slot = self._slots[slot_index]
            keep = []
            for item in slot:
                if item[0] == current:
                    due.append(item[1])
                else:
                    keep.append(item)
            self._slots[slot_index] = keep
        self._size -= len(due)
        due.sort()
        return due

    def clear(self) -> None:
        for slot in self._slots:
            slot.clear()
        self._ticks.clear()
        self._queued.clear()
        self._size = 0
