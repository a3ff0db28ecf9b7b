"""Options of store_rocks (the ``[plugins.store_rocks]`` table)."""

from __future__ import annotations

import attrs
from attrs import validators as v

from plugmq.kit.options import positive_number

_MIB = 1024 * 1024


@attrs.frozen
class RocksOptions:
    """How RocksDB is opened and how durable an acknowledged append is.

    ``flush="sync"``: every write batch (one per group of concurrent appends) is written with
    ``WriteOptions.sync=True``: the WAL is fsynced before the append returns.
    ``flush="async"``: ``WriteOptions.sync=False``: the WAL record reaches the OS with write(2)
    (a process crash loses nothing); a flusher thread calls ``flush_wal(sync=True)`` every
    ``flush_interval_ms``, and ``flush()``/``close()`` do too.
    ``disable_wal`` (off by default, async only) skips the WAL entirely: fastest, but anything
    not yet flushed from the memtables (``flush()`` does it) is lost even on a process crash.
    The WAL is replayed with point-in-time recovery, so a torn WAL tail drops whole batches only.

    ``file_reserved_hours``: retention; older messages go at the next ``clean_expired``.
    ``verify_tail_records`` / ``verify_tail_bytes``: at open, up to that many of each queue's
    newest records lying in the last ``verify_tail_bytes`` of the log are read and CRC-checked; a
    damaged or unreadable record there and everything after it are cut (RocketMQ's torn-tail rule).
    """

    flush: str = attrs.field(default="async", validator=v.in_(("sync", "async")))
    flush_interval_ms: int = attrs.field(default=500, validator=[v.instance_of(int), positive_number])
    disable_wal: bool = attrs.field(default=False, validator=v.instance_of(bool))
    write_buffer_size: int = attrs.field(default=64 * _MIB, validator=[v.instance_of(int), v.ge(_MIB)])
    compression: str = attrs.field(default="none", validator=v.in_(("none", "lz4", "zstd", "snappy")))
    file_reserved_hours: float = attrs.field(default=72.0, validator=positive_number)
    verify_tail_records: int = attrs.field(default=1024, validator=[v.instance_of(int), v.ge(0)])
    verify_tail_bytes: int = attrs.field(default=64 * _MIB, validator=[v.instance_of(int), v.ge(0)])
    retention_batch: int = attrs.field(default=1000, validator=[v.instance_of(int), v.ge(1)])

    def __attrs_post_init__(self) -> None:
        if self.disable_wal and self.flush == "sync":
            raise ValueError("disable_wal=true cannot give flush='sync' durability; use flush='async' or keep the WAL")
