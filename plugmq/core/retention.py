"""The retention floor: the lowest commit-log offset some reader still needs.

A store may remove old records, but never at or above the floor. The broker holds the floor for
its consumer groups; a service that keeps messages in the store (transaction halves, delay levels,
pop state) adds its own source through ``context.retention.hold(...)``. A store keeps every record
at or above the floor, however old, unless its disk watermark forces a clean, which it logs and
counts. The broker's schedule that calls ``clean_expired`` is ``plugmq.broker.retention``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from plugmq.core.logs import get_logger

__all__ = ["FloorSource", "RetentionFloor"]

log = get_logger(__name__)

FloorSource = Callable[[], "int | None"]
"""Returns the lowest commit-log offset its owner still needs, or None when it needs nothing."""


class RetentionFloor:
    """The lowest commit-log offset any registered reader still needs.

    Sources are asked on every :meth:`lowest` call (once per retention round), so they report
    their current need, never a stale one. A source that raises is logged and taken as needing
    everything (offset 0): an unknown need never lets retention remove data.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, FloorSource] = {}

    def hold(self, name: str, source: FloorSource) -> None:
        """Register (or replace) ``source`` under ``name`` (e.g. ``"txn"``, ``"consumer groups"``)."""
        with self._lock:
            self._sources[name] = source

    def release(self, name: str) -> None:
        """Forget the source registered under ``name`` (its owner closed)."""
        with self._lock:
            self._sources.pop(name, None)

    def lowest(self) -> int | None:
        """The lowest commit-log offset still needed; None when no source holds anything."""
        with self._lock:
            sources = list(self._sources.items())
        low: int | None = None
        for name, source in sources:
            try:
                need = source()
            except Exception:
                log.exception("retention floor source failed; holding everything", source=name)
                need = 0
            if need is not None and (low is None or need < low):
                low = need
        return low

    def holders(self) -> dict[str, int | None]:
        """Each source's current need, for logs and admin output."""
        with self._lock:
            sources = list(self._sources.items())
        out: dict[str, int | None] = {}
        for name, source in sources:
            try:
                out[name] = source()
            except Exception:  # noqa: BLE001 - reported as holding everything, like lowest()
                out[name] = 0
        return out
