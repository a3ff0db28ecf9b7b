"""Mergeable latency histograms: fixed log-spaced buckets, so repetitions are merged by adding counts.

Percentiles of several runs are read from the merged counts, never averaged. Every histogram uses
the same bucket edges (``BUCKETS_PER_DECADE`` per decade from ``MIN_MS`` to ``MAX_MS``), so any two
can be added. Bucket 0 holds values <= 0 (a delivery exactly on time has lateness 0); the last
bucket holds everything above ``MAX_MS``. A percentile is the upper edge of the bucket it falls in,
clipped to the exact maximum: at most ``10**(1/BUCKETS_PER_DECADE) - 1`` (about 6 %) above the
true value, never below it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["BUCKETS_PER_DECADE", "N_BUCKETS", "Histogram", "bucket_of", "bucket_upper_ms", "quantile_from_counts"]

MIN_MS = 1e-3
MAX_MS = 1e8
BUCKETS_PER_DECADE = 40
_DECADES = round(math.log10(MAX_MS / MIN_MS))
N_BUCKETS = 2 + _DECADES * BUCKETS_PER_DECADE  # [<=0] + log buckets + [>MAX_MS]


def bucket_of(value_ms: float) -> int:
    """Index of the bucket holding ``value_ms``."""
    if value_ms <= 0:
        return 0
    if value_ms <= MIN_MS:
        return 1
    k = math.ceil(math.log10(value_ms / MIN_MS) * BUCKETS_PER_DECADE - 1e-9)
    return min(N_BUCKETS - 1, max(k, 1) + 1)


def bucket_upper_ms(bucket: int) -> float:
    """Upper edge of ``bucket`` (0 for the <=0 bucket, +inf for the overflow bucket)."""
    if bucket <= 0:
        return 0.0
    if bucket >= N_BUCKETS - 1:
        return math.inf
    return MIN_MS * 10 ** ((bucket - 1) / BUCKETS_PER_DECADE)


def quantile_from_counts(counts: Mapping[int, int], q: float, *, max_value: float | None = None) -> float | None:
    """The ``q`` quantile (0..1) of a histogram given as {bucket: count}; None when empty."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            upper = bucket_upper_ms(bucket)
            if max_value is not None and (upper > max_value or math.isinf(upper)):
                return float(max_value)
            return upper
    raise AssertionError("unreachable: rank <= total")


class Histogram:
    """Counts of values (milliseconds) in the fixed buckets, plus exact count, sum, min and max."""

    def __init__(self) -> None:
        self.counts = np.zeros(N_BUCKETS, dtype=np.int64)
        self.n = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value_ms: float, weight: int = 1) -> None:
        self.counts[bucket_of(value_ms)] += weight
        self.n += weight
        self.total += value_ms * weight
        self.min = min(self.min, value_ms)
        self.max = max(self.max, value_ms)

    def record_many(self, values_ms: Iterable[float]) -> None:
        array = np.asarray(list(values_ms), dtype=np.float64)
        if array.size == 0:
            return
        positive = array[array > 0]
        buckets = np.zeros(array.size - positive.size, dtype=np.int64)
        with np.errstate(divide="ignore"):
            k = np.ceil(np.log10(np.maximum(positive, MIN_MS) / MIN_MS) * BUCKETS_PER_DECADE - 1e-9).astype(np.int64)
        logb = np.where(positive <= MIN_MS, 1, np.minimum(np.maximum(k, 1) + 1, N_BUCKETS - 1))
        np.add.at(self.counts, np.concatenate([buckets, logb]), 1)
        self.n += int(array.size)
        self.total += float(array.sum())
        self.min = min(self.min, float(array.min()))
        self.max = max(self.max, float(array.max()))

    def merge(self, other: Histogram) -> None:
        self.counts += other.counts
        self.n += other.n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def sparse(self) -> dict[int, int]:
        """The non-empty buckets, as stored in the ``histograms`` table."""
        return {int(b): int(c) for b, c in enumerate(self.counts) if c}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (a child process hands its histogram over as a line of JSON)."""
        return {"buckets": {str(b): c for b, c in self.sparse().items()}, "n": self.n, "total": self.total,
                "min": self.min if self.n else None, "max": self.max if self.n else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        """The histogram :meth:`to_json` described."""
        hist = cls()
        for bucket, count in data["buckets"].items():
            hist.counts[int(bucket)] = int(count)
        hist.n = int(data["n"])
        hist.total = float(data["total"])
        if hist.n:
            hist.min, hist.max = float(data["min"]), float(data["max"])
        return hist

    def quantile(self, q: float) -> float | None:
        return quantile_from_counts(self.sparse(), q, max_value=self.max if self.n else None)

    def summary(self, prefix: str, quantiles: Iterable[tuple[str, float]]) -> dict[str, float]:
        """``{prefix_p50_ms: .., prefix_max_ms: .., prefix_mean_ms: ..}``; empty when nothing was recorded."""
        if self.n == 0:
            return {}
        out = {f"{prefix}_{label}_ms": float(self.quantile(q)) for label, q in quantiles}  # type: ignore[arg-type]
        out[f"{prefix}_max_ms"] = float(self.max)
        out[f"{prefix}_mean_ms"] = self.total / self.n
        return out
