"""Options of store_mmap: the keys of the ``[plugins.store_mmap]`` table.

Defaults follow RocketMQ's MessageStoreConfig (1 GiB commit-log segments, 300k consume-queue entries
per file, 5M index slots / 20M index entries, 72 h retention deleted at 04:00, 75 % / 90 % disk
watermarks); tests shrink the sizes.
"""

from __future__ import annotations

from typing import Any

import attrs

from plugmq.core import ConfigError

__all__ = ["MmapStoreOptions", "parse_delete_when"]

_MIN_SEGMENT = 4096


def _positive(_inst: Any, attr: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"store_mmap.{attr.name} must be a positive integer, got {value!r}")


def _non_negative(_inst: Any, attr: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"store_mmap.{attr.name} must be an integer >= 0, got {value!r}")


def _bool(_inst: Any, attr: attrs.Attribute, value: bool) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"store_mmap.{attr.name} must be true or false, got {value!r}")


def _ratio(_inst: Any, attr: attrs.Attribute, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"store_mmap.{attr.name} must be a ratio between 0.0 and 1.0, got {value!r}")


def parse_delete_when(text: str) -> frozenset[int]:
    """RocketMQ's ``deleteWhen``: hours of the day separated by ``;`` (e.g. ``"04"`` or ``"04;16"``)."""
    hours = set()
    for part in str(text).split(";"):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ConfigError(
                f"store_mmap.delete_when {text!r}: {part!r} is not an hour 00-23; use e.g. \"04\" or \"04;16\""
            )
        hours.add(int(part))
    if not hours:
        raise ConfigError(f"store_mmap.delete_when {text!r} names no hour; use e.g. \"04\"")
    return frozenset(hours)


@attrs.frozen
class MmapStoreOptions:
    """Every field is a key of ``[plugins.store_mmap]``.

    Sizes: ``commit_log_segment_size`` bytes per commit-log file; ``consume_queue_entries_per_file``
    20-byte entries per consume-queue file; ``index_slot_count`` / ``index_max_entries`` per index file.
    Flush: ``flush`` is ``"async"`` (a background thread flushes every ``flush_interval_ms`` once
    ``flush_least_pages`` 4 KiB pages are dirty, everything every ``flush_thorough_interval_ms``) or
    ``"sync"`` (group commit; a write whose flush takes longer than ``sync_flush_timeout_ms`` is
    reported FLUSH_DISK_TIMEOUT). Consume queues, index and checkpoint are flushed every
    ``derived_flush_interval_ms``. Retention: segments whose last write is older than
    ``file_reserved_hours`` are deleted at the hours in ``delete_when`` (local time of the clock), or at
    once when disk use passes ``disk_max_used_ratio``; above ``disk_force_clean_ratio`` the oldest
    segment goes even if not expired (one per clean); above ``disk_critical_ratio`` appends are
    refused. ``disk_check_interval_ms`` bounds how stale the disk-use figure may be.
    Index: ``index_unique_id`` also indexes each message's unique id (Prop.UNIQ_KEY), like RocketMQ;
    keys are queued by the append path and indexed ``index_batch`` at a time (queries, flushes and
    retention index whatever is queued first). Files: every byte gets its disk blocks
    (posix_fallocate, 16 MiB of a segment at a time) before it is written, so a full disk is a
    StoreFullError, never a SIGBUS; ``preallocate_next_segment`` creates the next commit-log
    segment on a background thread; ``warm_segments`` allocates it whole and faults its pages in
    (one write per page, RocketMQ's warmMappedFile).
    Recovery starts checking records where the checkpoint says everything was durable - after a
    clean shutdown that is the end of the log, so a clean restart re-reads only the newest record; with
    ``recover_check_segments`` > 0 it also re-checks that many newest segments record by record.
    Appends: ``append_kernel`` picks the compiled append kernel (``"c"``), the
    pure-Python one (``"python"``) or the compiled one when it was built (``"auto"``); both
    write the same bytes. Opening: ``scan_kernel`` picks the recovery scan the same way (compiled
    or Python; both check records and consume-queue entries by the same rules).
    """

    commit_log_segment_size: int = attrs.field(default=1 << 30, validator=_positive)
    consume_queue_entries_per_file: int = attrs.field(default=300_000, validator=_positive)
    index_slot_count: int = attrs.field(default=5_000_000, validator=_positive)
    index_max_entries: int = attrs.field(default=20_000_000, validator=_positive)
    index_unique_id: bool = attrs.field(default=True, validator=_bool)
    index_batch: int = attrs.field(default=512, validator=_positive)
    flush: str = attrs.field(default="async")
    flush_interval_ms: int = attrs.field(default=500, validator=_positive)
    flush_least_pages: int = attrs.field(default=4, validator=_non_negative)
    flush_thorough_interval_ms: int = attrs.field(default=10_000, validator=_positive)
    sync_flush_timeout_ms: int = attrs.field(default=5_000, validator=_positive)
    derived_flush_interval_ms: int = attrs.field(default=1_000, validator=_positive)
    file_reserved_hours: float = attrs.field(default=72.0)
    delete_when: str = attrs.field(default="04")
    disk_max_used_ratio: float = attrs.field(default=0.75, validator=_ratio)
    disk_force_clean_ratio: float = attrs.field(default=0.85, validator=_ratio)
    disk_critical_ratio: float = attrs.field(default=0.90, validator=_ratio)
    disk_check_interval_ms: int = attrs.field(default=1_000, validator=_positive)
    preallocate_next_segment: bool = attrs.field(default=True, validator=_bool)
    warm_segments: bool = attrs.field(default=False, validator=_bool)
    recover_check_segments: int = attrs.field(default=0, validator=_non_negative)
    append_kernel: str = attrs.field(default="auto")
    scan_kernel: str = attrs.field(default="auto")

    @commit_log_segment_size.validator
    def _check_segment(self, _attr: Any, value: int) -> None:
        if value < _MIN_SEGMENT:
            raise ConfigError(
                f"store_mmap.commit_log_segment_size {value} is too small; use at least {_MIN_SEGMENT} bytes"
            )
        if value > (1 << 31) - 1:
            raise ConfigError(
                f"store_mmap.commit_log_segment_size {value} exceeds 2 GiB - 1 (record sizes are int32)"
            )

    @flush.validator
    def _check_flush(self, _attr: Any, value: str) -> None:
        if value not in ("async", "sync"):
            raise ConfigError(f"store_mmap.flush must be \"async\" or \"sync\", got {value!r}")

    @append_kernel.validator
    @scan_kernel.validator
    def _check_kernel(self, attr: Any, value: str) -> None:
        if value not in ("auto", "c", "python"):
            raise ConfigError(
                f"store_mmap.{attr.name} must be \"auto\", \"c\" or \"python\", got {value!r} "
                "(auto: the compiled kernel when it was built, else Python)"
            )

    @file_reserved_hours.validator
    def _check_reserved(self, _attr: Any, value: float) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"store_mmap.file_reserved_hours must be a number >= 0, got {value!r}")

    @delete_when.validator
    def _check_delete_when(self, _attr: Any, value: str) -> None:
        parse_delete_when(value)

    @index_slot_count.validator
    def _check_slots(self, _attr: Any, value: int) -> None:
        if value > (1 << 28):
            raise ConfigError(f"store_mmap.index_slot_count {value} is too large; keep it at most 2**28")

    @index_max_entries.validator
    def _check_entries(self, _attr: Any, value: int) -> None:
        if value < 2:
            raise ConfigError(f"store_mmap.index_max_entries must be at least 2 (entry 0 is reserved), got {value}")
        if value > (1 << 30):
            raise ConfigError(f"store_mmap.index_max_entries {value} is too large; keep it at most 2**30")
