"""Lateness of deliveries (delivered at - deliver time) for the delay plugins' ``metrics()``.

Every delay plugin reports its lateness with :class:`LatenessHistogram`, so ``late_ms_p50``,
``late_ms_p99``, ``late_ms_max`` and ``late_ms_mean`` mean the same for delay_level, delay_wheel
and delay_schedule: over every delivery since the scheduler opened, percentiles by the one
quantile definition of :mod:`plugmq.kit.histogram` (nearest rank on the fixed log buckets, at
most ~6 % above the true value, never below it). An early delivery (negative lateness) counts as 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from plugmq.kit.histogram import Histogram

__all__ = ["LatenessHistogram"]


class LatenessHistogram(Histogram):
    __slots__ = ()

    def record(self, value_ms: float, weight: int = 1) -> None:
        super().record(max(0, value_ms), weight)

    def record_many(self, values_ms: Iterable[float]) -> None:
        super().record_many(max(0, v) for v in values_ms)

    @property
    def max_ms(self) -> float:
        return self.max if self.count else 0.0

    def figures(self, prefix: str = "late_ms") -> dict[str, float]:
        """``{prefix}_p50``, ``_p99``, ``_max`` and ``_mean`` (0 when nothing was delivered yet)."""
        return {
            f"{prefix}_p50": float(self.quantile(0.50) or 0.0),
            f"{prefix}_p99": float(self.quantile(0.99) or 0.0),
            f"{prefix}_max": self.max_ms,
            f"{prefix}_mean": self.mean() or 0.0,
        }
