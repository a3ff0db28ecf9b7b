"""Lateness of deliveries (now - deliver time) in a fixed log-spaced histogram, for delay plugins'
``metrics()`` (delay_wheel and delay_schedule share it).

A fixed set of buckets keeps memory constant however many messages pass; a percentile is
reported as the upper edge of its bucket (never above the true maximum), so it overstates by at
most ~26%: enough to tell "within a tick" from "hours late after an outage".
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from functools import cache
from typing import Any

__all__ = ["LatenessHistogram"]

# Upper edges in ms: 0, then ten per decade (each ~26% above the last) from 1 ms to ~11 days;
# the last bucket is open.
_EDGES: tuple[int, ...] = (0, *sorted({round(10 ** (k / 10)) for k in range(91)}))


@cache
def _numpy() -> tuple[Any, Any]:
    """numpy and the edges as an array, imported on the first batch (not when a broker starts)."""
    import numpy

    return numpy, numpy.array(_EDGES, dtype=numpy.int64)


class LatenessHistogram:
    def __init__(self) -> None:
        self._counts = [0] * (len(_EDGES) + 1)
        self.count = 0
        self.max_ms = 0

    def record(self, late_ms: int) -> None:
        late_ms = max(0, late_ms)
        self._counts[bisect.bisect_left(_EDGES, late_ms)] += 1
        self.count += 1
        self.max_ms = max(self.max_ms, late_ms)

    def record_many(self, late_ms: Iterable[int]) -> None:
        """Record a batch: one vectorised bucket search (a burst records a batch per write-back)."""
        np, edges = _numpy()
        values = np.fromiter(late_ms, dtype=np.int64)
        if not values.size:
            return
        np.maximum(values, 0, out=values)
        found = np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(self._counts))
        counts = self._counts
        for i in np.flatnonzero(found).tolist():
            counts[i] += int(found[i])
        self.count += int(values.size)
        self.max_ms = max(self.max_ms, int(values.max()))

    def quantile(self, q: float) -> int:
        if self.count == 0:
            return 0
        rank = q * self.count
        seen = 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= rank and n:
                return min(_EDGES[i], self.max_ms) if i < len(_EDGES) else self.max_ms
        return self.max_ms
