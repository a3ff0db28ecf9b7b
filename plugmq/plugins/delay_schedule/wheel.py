"""The in-memory hashed wheel (QMQ's ``HashedWheelTimer`` driven by ``WheelTickManager``).

Slots form a ring of ``slots`` buckets; an entry's tick is ``ceil(deliver_at / tick_ms)`` and it
lives in slot ``tick % slots``, under its own tick (a slot keeps the entries of later turns of
the ring apart, QMQ's ``remainingRounds``), so it fires at the first tick boundary at or after
its deliver time: never early, at most one tick late. With the default 1 ms tick that is the
deliver time itself.

Unlike Netty's worker, nothing ticks through empty slots: a min-heap of the absolute tick
numbers that hold entries tells the scheduler when to wake next (one clock timer). Popping a
tick takes its whole list at once, so a burst of half a million entries due in one second costs
a thousand list pops, not a scan per entry.

The wheel holds only the index (deliver time, sequence, segment, position, size); the record is
read from the schedule segment when it fires. Inside, an entry is a tuple of ints - its segment
stands as a number in a table of the segments the wheel holds entries of - because the cyclic GC
stops tracking tuples of ints but never a tuple that holds an object: half a million tracked
entries made every full collection during a burst walk them all. ``pop_due`` hands out
``WheelEntry`` again.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, NamedTuple

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
    size: int  # of the record, so delivery reads it without a header read first


_Stored = tuple[int, int, int, int, int]  # deliver_at_ms, seq, segment number, position, size


class HashedWheel:
    def __init__(self, *, tick_ms: int, slots: int) -> None:
        self.tick_ms = tick_ms
        self._mask = slots - 1
        self._slots: list[dict[int, list[_Stored]]] = [{} for _ in range(slots)]
        self._ticks: list[int] = []  # heap of ticks with entries
        self._size = 0
        # segment number -> (segment, entries of it in the wheel); a number is never reused
        self._segments: dict[int, list[Any]] = {}
        self._numbers: dict[int, int] = {}  # id(segment) -> its number, while it has entries here
        self._next_number = 0

    def __len__(self) -> int:
        return self._size

    def tick_of(self, when_ms: int) -> int:
        return -(-when_ms // self.tick_ms)

    def add(self, entry: WheelEntry) -> bool:
        """Insert; True when the entry's tick is now the earliest (the wake-up must move)."""
        return self.add_fields(entry.deliver_at_ms, entry.seq, entry.segment, entry.position, entry.size)

    def add_fields(self, deliver_at_ms: int, seq: int, segment: Segment, position: int, size: int) -> bool:
        """:meth:`add` of an entry given field by field (a segment load adds them by the hundred thousand)."""
        number = self._numbers.get(id(segment))
        if number is None:
            number = self._numbers[id(segment)] = self._next_number
            self._next_number += 1
            self._segments[number] = [segment, 0]
        self._segments[number][1] += 1
        tick = -(-deliver_at_ms // self.tick_ms)
        slot = self._slots[tick & self._mask]
        entries = slot.get(tick)
        earliest = not self._ticks or tick < self._ticks[0]
        if entries is None:
            slot[tick] = [(deliver_at_ms, seq, number, position, size)]
            heapq.heappush(self._ticks, tick)
        else:
            entries.append((deliver_at_ms, seq, number, position, size))
        self._size += 1
        return earliest

    def next_tick(self) -> int | None:
        return self._ticks[0] if self._ticks else None

    def pop_due(self, now_ms: int, limit: int | None = None) -> list[WheelEntry]:
        """Remove and return the entries of the ticks that have begun by ``now_ms`` (so every
        deliver time is <= now), oldest first; with ``limit``, whole ticks until it is reached."""
        last = now_ms // self.tick_ms
        due: list[_Stored] = []
        while self._ticks and self._ticks[0] <= last and (limit is None or len(due) < limit):
            tick = heapq.heappop(self._ticks)
            entries = self._slots[tick & self._mask].pop(tick)
            entries.sort()
            due.extend(entries)
        self._size -= len(due)
        segments = self._segments
        out = [WheelEntry(at, seq, segments[number][0], position, size) for at, seq, number, position, size in due]
        for entry in due:
            held = segments[entry[2]]
            held[1] -= 1
            if not held[1]:  # the wheel holds no entry of it any more
                del segments[entry[2]]
                del self._numbers[id(held[0])]
        return out

    def clear(self) -> None:
        for slot in self._slots:
            slot.clear()
        self._ticks.clear()
        self._size = 0
        self._segments.clear()
        self._numbers.clear()
