"""Lateness of deliveries (delivered at - deliver time): exact figures over a recent window.

A ring of the last ``window`` values keeps memory fixed; p50/p99 are exact over that window,
max and mean over every delivery since start.
"""

from __future__ import annotations

from array import array

__all__ = ["Lateness"]


class Lateness:
    def __init__(self, window: int = 65536) -> None:
        self._ring = array("q", bytes(8 * window))
        self._window = window
        self.count = 0
        self.total_ms = 0
        self.max_ms = 0

    def record(self, late_ms: int) -> None:
        late_ms = max(0, late_ms)
        self._ring[self.count % self._window] = late_ms
        self.count += 1
        self.total_ms += late_ms
        self.max_ms = max(self.max_ms, late_ms)

    def quantile(self, q: float) -> int:
        n = min(self.count, self._window)
        if n == 0:
            return 0
        values = sorted(self._ring[:n])
        return values[min(n - 1, int(q * n))]

    def figures(self, prefix: str = "late_ms") -> dict[str, float]:
        return {
            f"{prefix}_p50": float(self.quantile(0.50)),
            f"{prefix}_p99": float(self.quantile(0.99)),
            f"{prefix}_max": float(self.max_ms),
            f"{prefix}_mean": self.total_ms / self.count if self.count else 0.0,
        }
