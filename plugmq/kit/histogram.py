"""The one latency histogram and the one quantile definition of plugmq.

Every percentile plugmq reports - a delay plugin's ``late_ms_p99`` in ``metrics()``, the
benchmarks' p50/p99, the Spark comparisons' ``*_p99_ms`` - comes from :class:`Histogram`:

* **Buckets**: fixed and log-spaced, ``BUCKETS_PER_DECADE`` (40) per decade from ``MIN_MS``
  (1 us) to ``MAX_MS`` (1e8 ms, about 28 hours), in the manner of HdrHistogram. Bucket 0 holds
  values <= 0 (a delivery exactly on time has lateness 0); bucket 1 holds (0, MIN_MS]; the last
  bucket everything above ``MAX_MS``. Every histogram has the same edges, so histograms of
  several runs or threads merge by adding counts, and memory stays fixed however many values pass.
* **Quantile** ``q`` (0..1): **nearest rank** - the value of rank ``ceil(q * n)`` (at least 1)
  in sorted order - read as the upper edge of the bucket that rank falls in, clipped to the exact
  maximum seen. So a percentile is never below the true one and at most
  ``10 ** (1 / 40) - 1`` (about 6 %) above it; p100 is the exact maximum; a rank in bucket 0
  reads as 0 (or as the maximum, when every value was below 0).

Count, sum, minimum and maximum are kept exactly beside the buckets. Recording one value is pure
Python; :meth:`Histogram.record_many` vectorises a batch with numpy (imported on first use, not
when a broker starts), except a small one: numpy's fixed cost per call (~0.1 ms) is more than a
few dozen values cost in Python, and a delay plugin on time records a handful per batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

__all__ = ["BUCKETS_PER_DECADE", "MAX_MS", "MIN_MS", "N_BUCKETS", "Histogram", "bucket_of", "bucket_upper_ms",
           "quantile_from_counts"]

MIN_MS = 1e-3
MAX_MS = 1e8
BUCKETS_PER_DECADE = 40
_DECADES = round(math.log10(MAX_MS / MIN_MS))
N_BUCKETS = 2 + _DECADES * BUCKETS_PER_DECADE  # [<=0] + (0, MIN] + log buckets up to MAX + [>MAX]
_SMALL_BATCH = 64  # record_many goes through numpy above this many values
_FEW = 4  # and value by value up to this many (a push consumer's listener gets one message at a time)


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
    """The ``q`` quantile (nearest rank, see the module docstring) of ``{bucket: count}``; None when empty."""
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


@cache
def _numpy() -> Any:
    import numpy

    return numpy


class Histogram:
    """Counts of values (milliseconds) in the fixed buckets, plus exact count, sum, minimum and maximum."""

    __slots__ = ("count", "counts", "max", "min", "total")

    def __init__(self) -> None:
        self.counts = [0] * N_BUCKETS
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value_ms: float, weight: int = 1) -> None:
        self.counts[bucket_of(value_ms)] += weight
        self.count += weight
        self.total += value_ms * weight
        if value_ms < self.min:
            self.min = value_ms
        if value_ms > self.max:
            self.max = value_ms

    def record_many(self, values_ms: Iterable[float]) -> None:
        """Record a batch in one vectorised pass (a delay plugin's burst, a run's latencies); a
        small batch value by value, equal values once with their count (lateness in whole ms repeats)."""
        values = values_ms if isinstance(values_ms, list) else list(values_ms)
        if len(values) <= _SMALL_BATCH:
            record = self.record
            if len(values) <= _FEW:  # a Counter (~5 us to build) costs more than it saves on a handful
                for value in values:
                    record(value)
                return
            for value, weight in Counter(values).items():
                record(value, weight)
            return
        np = _numpy()
        array = np.array(values, dtype=np.float64)
        if array.size == 0:
            return
        buckets = np.ones(array.size, dtype=np.int64)
        above = array > MIN_MS
        with np.errstate(divide="ignore"):
            k = np.ceil(np.log10(array[above] / MIN_MS) * BUCKETS_PER_DECADE - 1e-9).astype(np.int64)
        buckets[above] = np.minimum(np.maximum(k, 1) + 1, N_BUCKETS - 1)
        buckets[array <= 0] = 0
        found = np.bincount(buckets, minlength=N_BUCKETS)
        counts = self.counts
        for bucket in np.flatnonzero(found).tolist():
            counts[bucket] += int(found[bucket])
        self.count += int(array.size)
        self.total += float(array.sum())
        self.min = min(self.min, float(array.min()))
        self.max = max(self.max, float(array.max()))

    def merge(self, other: Histogram) -> None:
        for bucket, count in other.sparse().items():
            self.counts[bucket] += count
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def n(self) -> int:
        return self.count

    def sparse(self) -> dict[int, int]:
        """The non-empty buckets, ``{bucket: count}`` (as the Spark ``histograms`` table stores them)."""
        return {bucket: count for bucket, count in enumerate(self.counts) if count}

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank, see the module docstring); None when nothing was recorded."""
        return quantile_from_counts(self.sparse(), q, max_value=self.max if self.count else None)

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def summary(self, prefix: str, quantiles: Iterable[tuple[str, float]]) -> dict[str, float]:
        """``{prefix_p50_ms: .., prefix_max_ms: .., prefix_mean_ms: ..}``; empty when nothing was recorded."""
        if self.count == 0:
            return {}
        out = {f"{prefix}_{label}_ms": float(self.quantile(q) or 0.0) for label, q in quantiles}
        out[f"{prefix}_max_ms"] = float(self.max)
        out[f"{prefix}_mean_ms"] = self.total / self.count
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (a child process hands its histogram over as a line of JSON)."""
        return {"buckets": {str(b): c for b, c in self.sparse().items()}, "n": self.count, "total": self.total,
                "min": self.min if self.count else None, "max": self.max if self.count else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        """The histogram :meth:`to_json` described."""
        hist = cls()
        for bucket, count in data["buckets"].items():
            hist.counts[int(bucket)] = int(count)
        hist.count = int(data["n"])
        hist.total = float(data["total"])
        if hist.count:
            hist.min, hist.max = float(data["min"]), float(data["max"])
        return hist
