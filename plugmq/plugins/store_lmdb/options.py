"""Options of store_lmdb (the ``[plugins.store_lmdb]`` table)."""

from __future__ import annotations

import attrs
from attrs import validators as v

from plugmq.kit.options import positive_number

_MIB = 1024 * 1024


@attrs.frozen
class LmdbOptions:
    """How the LMDB environment is opened and how durable an acknowledged append is.

    ``flush="sync"``: the environment is opened with ``sync=True, metasync=True``: every commit
    (one per group of concurrent appends) fsyncs data and meta page before the append returns.
    ``flush="async"``: ``sync=False``: a commit returns once written to the page cache (a process
    crash loses nothing); a flusher thread calls ``env.sync(True)`` every ``flush_interval_ms``
    and ``flush()``/``close()`` do too. With ``writemap=False`` LMDB keeps the database intact
    after an OS crash in async mode; only commits since the last sync may be undone.

    ``map_size`` is the initial map (a sparse file; it costs no disk until used); on MapFullError
    the store doubles it and retries the same commit, up to ``max_map_size`` (then StoreFullError).
    ``file_reserved_hours``: retention; older messages go at the next ``clean_expired``.
    ``verify_tail_records`` / ``verify_tail_bytes``: how much of the log's tail is CRC-checked at
    open; a damaged record there and everything after it are cut (RocketMQ's torn-tail rule).
    """

    flush: str = attrs.field(default="async", validator=v.in_(("sync", "async")))
    flush_interval_ms: int = attrs.field(default=500, validator=[v.instance_of(int), positive_number])
    map_size: int = attrs.field(default=256 * _MIB, validator=[v.instance_of(int), v.ge(_MIB)])
    max_map_size: int = attrs.field(default=1 << 40, validator=[v.instance_of(int), v.ge(_MIB)])
    writemap: bool = attrs.field(default=False, validator=v.instance_of(bool))
    max_readers: int = attrs.field(default=126, validator=[v.instance_of(int), v.ge(1)])
    file_reserved_hours: float = attrs.field(default=72.0, validator=positive_number)
    verify_tail_records: int = attrs.field(default=1024, validator=[v.instance_of(int), v.ge(0)])
    verify_tail_bytes: int = attrs.field(default=64 * _MIB, validator=[v.instance_of(int), v.ge(0)])
    retention_batch: int = attrs.field(default=1000, validator=[v.instance_of(int), v.ge(1)])

    def __attrs_post_init__(self) -> None:
        if self.max_map_size < self.map_size:
            raise ValueError(f"max_map_size ({self.max_map_size}) must be >= map_size ({self.map_size})")
