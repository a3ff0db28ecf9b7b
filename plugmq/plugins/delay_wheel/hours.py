"""The hour wheel's storage side: which hours have files, which are mapped, which are open.

Only hours that hold messages have files, so a two-year horizon costs nothing for empty hours.
Mapped hours (at most two: the wheel's window) live in ``_mapped``; far hours that were written
recently stay open in a small LRU so a burst into one far hour does not reopen files per message.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from pathlib import Path

from plugmq.plugins.delay_wheel.hourfiles import (
    HOUR_FILE_SUFFIXES,
    HourFiles,
    hour_file_stem,
)

__all__ = ["HourDirectory"]


class HourDirectory:
    def __init__(self, root: Path, *, fsync: bool, open_cache: int) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._open_cache = open_cache
        self._mapped: dict[int, HourFiles] = {}
        self._lru: OrderedDict[int, HourFiles] = OrderedDict()
        found = {int(p.stem) for p in root.iterdir() if p.suffix in (".idx", ".head") and p.stem.isdigit()}
        self.hours: list[int] = sorted(found)

    def __contains__(self, hour: int) -> bool:
        i = bisect.bisect_left(self.hours, hour)
        return i < len(self.hours) and self.hours[i] == hour

    def first_hours(self, at_or_after: int, n: int) -> list[int]:
        i = bisect.bisect_left(self.hours, at_or_after)
        return self.hours[i:i + n]

    def hours_before(self, hour: int) -> list[int]:
        return self.hours[:bisect.bisect_left(self.hours, hour)]

    def mapped_hours(self) -> list[int]:
        return sorted(self._mapped)

    def get(self, hour: int, *, create: bool = False) -> HourFiles | None:
        files = self._mapped.get(hour)
        if files is not None:
            return files
        files = self._lru.get(hour)
        if files is not None:
            self._lru.move_to_end(hour)
            return files
        if hour not in self:
            if not create:
                return None
            bisect.insort(self.hours, hour)
        files = HourFiles(self.root, hour, fsync=self._fsync)
        self._lru[hour] = files
        while len(self._lru) > self._open_cache:
            _, old = self._lru.popitem(last=False)
            old.close(sync=False)
        return files

    def map(self, hour: int) -> HourFiles:
        files = self._lru.pop(hour, None) or self._mapped.get(hour) or HourFiles(self.root, hour, fsync=self._fsync)
        files.map()
        self._mapped[hour] = files
        return files

    def unmap(self, hour: int) -> None:
        files = self._mapped.pop(hour, None)
        if files is None:
            return
        files.unmap()
        self._lru[hour] = files
        while len(self._lru) > self._open_cache:
            _, old = self._lru.popitem(last=False)
            old.close(sync=False)

    def delete(self, hour: int) -> int:
        """Remove an hour's files; returns how many were removed."""
        files = self._mapped.pop(hour, None) or self._lru.pop(hour, None)
        removed = 0
        if files is not None:
            removed = files.delete()
        else:
            for suffix in HOUR_FILE_SUFFIXES:
                path = self.root / (hour_file_stem(hour) + suffix)
                if path.exists():
                    path.unlink()
                    removed += 1
        i = bisect.bisect_left(self.hours, hour)
        if i < len(self.hours) and self.hours[i] == hour:
            del self.hours[i]
        return removed

    def close(self) -> None:
        for files in [*self._mapped.values(), *self._lru.values()]:
            files.close(sync=True)
        self._mapped.clear()
        self._lru.clear()
