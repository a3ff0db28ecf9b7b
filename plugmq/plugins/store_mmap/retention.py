"""Retention and disk watermarks (RocketMQ's CleanCommitLogService, simplified).

A commit-log segment's last write is the store time of the first record of the next segment
(the roll-over happens in the same locked step), or of its own last record when the next one is
still empty. Segments are removed oldest first, never the one being written, and never one
holding a record at or above the retention floor (what a consumer group or a service still
needs, ``store.retention``) - unless disk use passes ``disk_force_clean_ratio``, which removes
the oldest segment anyway and says so in a warning and in the ``forced_*`` counters.
Consume-queue and index files that only point at removed segments go too, and queue min offsets
move up. The broker calls ``clean`` every few seconds of its clock (plugmq.core.retention).
Times come from the store's Clock (store timestamps and ``now_ms``); the hour of day is local time.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING

from plugmq.core.errors import StoreFullError
from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.mapped_file import MappedFile
from plugmq.plugins.store_mmap.options import MmapStoreOptions, parse_delete_when

if TYPE_CHECKING:
    from plugmq.plugins.store_mmap.store import MmapMessageStore

__all__ = ["Retention"]

log = get_logger(__name__)


class Retention:
    def __init__(self, store: MmapMessageStore, opts: MmapStoreOptions) -> None:
        self._store = store
        self._hours = parse_delete_when(opts.delete_when)
        self._reserved_ms = int(opts.file_reserved_hours * 3_600_000)
        self._max_used = opts.disk_max_used_ratio
        self._force = opts.disk_force_clean_ratio
        self._critical = opts.disk_critical_ratio
        self._interval = opts.disk_check_interval_ms / 1000.0
        self.next_check = 0.0
        self._last_write: dict[int, int] = {}
        self.disk_ratio = 0.0
        self.full = False
        self.over_critical = False
        self.deleted = 0
        self.forced = 0  # segments removed by the force-clean watermark
        self.forced_unconsumed_bytes = 0  # of them, bytes some consumer had not consumed yet
        self.held = False  # an expired segment is kept for a consumer right now
        self._held_logged: int | None = None
        self.refresh(force=True)

    # -- disk watermarks ----------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        # Disk use is sampled at most every disk_check_interval_ms (real time): statvfs on every
        # append would cost more than the append.
        now = time.monotonic()
        if not force and now < self.next_check:
            return
        self.next_check = now + self._interval
        usage = shutil.disk_usage(self._store.dir)
        # Like df: used / (used + available to unprivileged writers); 100 % is where writes fail.
        room = usage.used + usage.free
        self.disk_ratio = usage.used / room if room else 0.0
        over = self.disk_ratio > self._critical
        if over != self.over_critical:
            log.warning("disk watermark crossed", disk_used=round(self.disk_ratio, 4), refusing_writes=over)
        self.over_critical = self.full = over  # ``full``: read unlocked by the append path

    def check_disk(self) -> None:
        """Raise StoreFullError while disk use is above the critical watermark."""
        if time.monotonic() >= self.next_check:
            self.refresh()
        if self.over_critical:
            raise StoreFullError(
                f"disk holding {self._store.dir} is {self.disk_ratio:.1%} used, above "
                f"store_mmap.disk_critical_ratio {self._critical:.0%}; writes are refused until retention "
                f"(clean_expired) frees space or the watermark is raised"
            )

    # -- cleaning -----------------------------------------------------------------------------

    def _last_write_of(self, segments: tuple[MappedFile, ...], i: int) -> int | None:
        seg = segments[i]
        known = self._last_write.get(seg.start)
        if known is not None:
            return known
        cl = self._store.commit_log
        when = cl.store_timestamp(segments[i + 1].start) if i + 1 < len(segments) else None
        if when is None:
            stamps: list[int] = []
            cl.walk(seg.start, lambda rec: stamps.append(rec.store_ts), limit=seg.end)
            when = stamps[-1] if stamps else None
        if when is not None:
            self._last_write[seg.start] = when
        return when

    def _choose(self, now_ms: int, force: bool) -> tuple[list[MappedFile], MappedFile | None, int | None]:
        """Segments to delete, oldest first: expired ones below the floor; with ``force`` and
        nothing else to delete, the oldest one regardless (returned second as well). The floor
        (returned third) is only asked for once a segment has expired."""
        cl = self._store.commit_log
        segments = cl.segments
        victims: list[MappedFile] = []
        held: MappedFile | None = None
        floor: int | None = None
        asked = False
        for i, seg in enumerate(segments[:-1]):
            if seg is cl.cur:
                break
            last = self._last_write_of(segments, i)
            expired = last is not None and now_ms - last >= self._reserved_ms
            if expired and not asked:
                source = self._store.retention
                floor = source.lowest() if source is not None else None
                asked = True
            if expired and floor is not None and seg.end > floor:
                held = seg
                break
            if not expired:
                break
            victims.append(seg)
        if held is not None and held.start != self._held_logged:
            self._held_logged = held.start
            log.info("expired commit-log segment kept: a consumer group or service has not consumed it",
                     segment=held.path.name, floor=floor, holders=self._holders())
        self.held = held is not None
        forced = None
        if force and not victims and len(segments) > 1 and segments[0] is not cl.cur:
            forced = segments[0]
            victims.append(forced)
            if not asked:
                source = self._store.retention
                floor = source.lowest() if source is not None else None
        return victims, forced, floor

    def _holders(self) -> dict[str, int | None]:
        floor = self._store.retention
        return floor.holders() if floor is not None else {}

    def clean(self, now_ms: int) -> int:
        """Delete what the policy allows at ``now_ms``; return how many files went."""
        self.refresh(force=True)
        at_hour = time.localtime(now_ms / 1000).tm_hour in self._hours
        pressure = self.disk_ratio > self._max_used
        force = self.disk_ratio > self._force
        if not (at_hour or pressure or force):
            return 0
        store = self._store
        cl = store.commit_log
        victims, forced, floor = self._choose(now_ms, force)
        if not victims:
            return 0
        store.drain_index()  # keys still queued would otherwise land in the index after the cut
        with store.put_lock:
            segments = cl.segments
            # Appends only add segments at the end; check the chosen ones are still the oldest.
            still = 0
            while still < len(victims) and still < len(segments) and victims[still] is segments[still] \
                    and victims[still] is not cl.cur:
                still += 1
            victims = victims[:still]
            for seg in victims:
                cl.detach_first(seg)
            commit_log_min = cl.min_offset
            removed = len(victims)
            for cq in store.consume_queues:
                removed += cq.drop_expired(commit_log_min)
        for seg in victims:
            self._last_write.pop(seg.start, None)
            seg.destroy()
        removed += store.index.drop_expired(commit_log_min)
        if forced is not None and forced in victims:
            self.forced += 1
            unconsumed = max(0, forced.end - max(forced.start, floor)) if floor is not None else 0
            self.forced_unconsumed_bytes += unconsumed
            log.warning(
                "disk above the force-clean watermark: oldest commit-log segment removed regardless of age"
                + (" and of consumers: messages not yet consumed are gone" if unconsumed else ""),
                segment=forced.path.name, disk_used=round(self.disk_ratio, 4), force_ratio=self._force,
                unconsumed_bytes=unconsumed, floor=floor, holders=self._holders() if unconsumed else {},
            )  # fmt: skip
        if removed:
            log.info(
                "retention removed files", segments=len(victims), files=removed, commit_log_min=commit_log_min,
                at_hour=at_hour, disk_used=round(self.disk_ratio, 4),
            )  # fmt: skip
        self.deleted += removed
        return removed
