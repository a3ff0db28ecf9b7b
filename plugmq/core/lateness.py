"""Lateness of deliveries (now - deliver time) in a fixed log-spaced histogram, for delay plugins'
``metrics()`` (delay_wheel and delay_schedule share it).

A fixed set of buckets keeps memory constant however many messages pass; a percentile is
reported as the upper edge of its bucket (never above the true maximum), so it overstates by at
most ~26%: enough to tell "within a tick" from "hours late after an outage".
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["LatenessHistogram"]

# Upper edges in ms: 0, then ten per decade (each ~26% above the last) from 1 ms to ~11 days;
# the last bucket is open.
_EDGES: tuple[int, ...] = (0, *sorted({round(10 ** (k / 10)) for k in range(91)}))


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
        counts, edges, find = self._counts, _EDGES, bisect.bisect_left
        top = self.max_ms
        n = 0
        for value in late_ms:
            value = max(0, value)
            counts[find(edges, value)] += 1
            top = max(top, value)
            n += 1
        self.count += n
        self.max_ms = top

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
