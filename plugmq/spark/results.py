"""What one experiment returns: a status row, metric rows, time-series rows and histograms.

Everything leaves a task as rows of one long schema (:data:`LONG_COLUMNS`), which the driver
splits into the ``experiments``, ``metrics``, ``timeseries`` and ``histograms`` tables.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import attrs

from plugmq.kit.histogram import Histogram

__all__ = ["LONG_COLUMNS", "LONG_SCHEMA", "ExperimentResult", "WindowSeries"]

# kind: "experiment" | "metric" | "series" | "histogram". One schema so a Spark task yields one frame.
LONG_COLUMNS = ("kind", "experiment_id", "name", "value", "unit", "deterministic", "window_start_s", "bucket", "text")
LONG_SCHEMA = ("kind string, experiment_id string, name string, value double, unit string, deterministic boolean, "
               "window_start_s double, bucket int, text string")

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))


@attrs.define
class ExperimentResult:
    experiment_id: str
    status: str = "ok"  # ok | failed | unsupported
    error: str = ""
    info: dict[str, Any] = attrs.field(factory=dict)
    metrics: list[tuple[str, float, str, bool]] = attrs.field(factory=list)
    series: list[tuple[float, str, float]] = attrs.field(factory=list)
    histograms: dict[str, Histogram] = attrs.field(factory=dict)

    def metric(self, name: str, value: float | None, unit: str = "", *, deterministic: bool = False) -> None:
        if value is not None:
            self.metrics.append((name, float(value), unit, deterministic))

    def histogram(self, name: str, hist: Histogram, *, deterministic: bool = False,
                  quantiles: Iterable[tuple[str, float]] = QUANTILES) -> None:
        """Keep the histogram (merged across repetitions later) and its percentiles as metrics."""
        if hist.count == 0:
            return
        self.histograms[name] = hist
        for key, value in hist.summary(name, quantiles).items():
            self.metric(key, value, "ms", deterministic=deterministic)
        self.metric(f"{name}_count", hist.count, "msg", deterministic=deterministic)

    def metric_map(self) -> dict[str, float]:
        return {name: value for name, value, _, _ in self.metrics}

    def rows(self) -> list[dict[str, Any]]:
        base = dict.fromkeys(LONG_COLUMNS)
        info = {**self.info, "status": self.status, "error": self.error}
        out = [{**base, "kind": "experiment", "experiment_id": self.experiment_id, "name": self.status,
                "text": json.dumps(info, default=str, sort_keys=True)}]
        for name, value, unit, det in self.metrics:
            out.append({**base, "kind": "metric", "experiment_id": self.experiment_id, "name": name,
                        "value": value, "unit": unit, "deterministic": det})
        for start, name, value in self.series:
            out.append({**base, "kind": "series", "experiment_id": self.experiment_id, "name": name,
                        "value": value, "window_start_s": start})
        for name, hist in self.histograms.items():
            for bucket, count in hist.sparse().items():
                out.append({**base, "kind": "histogram", "experiment_id": self.experiment_id, "name": name,
                            "value": float(count), "bucket": bucket})
        return out


class WindowSeries:
    """Per-window sums and maxima, keyed by the window's start (seconds from the run's start)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.sums: dict[tuple[float, str], float] = defaultdict(float)
        self.maxima: dict[tuple[float, str], float] = {}

    def _start(self, at_s: float) -> float:
        return (at_s // self.window_s) * self.window_s

    def add(self, at_s: float, name: str, amount: float = 1.0) -> None:
        self.sums[(self._start(at_s), name)] += amount

    def peak(self, at_s: float, name: str, value: float) -> None:
        key = (self._start(at_s), name)
        self.maxima[key] = max(self.maxima.get(key, value), value)

    def rows(self, rates: dict[str, str], horizon_s: float) -> list[tuple[float, str, float]]:
        """Series rows; every summed name listed in ``rates`` also yields a per-second rate (over
        the part of the window before ``horizon_s``, the end of the run, for the last one)."""
        out = []
        for (start, name), total in sorted(self.sums.items()):
            out.append((start, name, total))
            if name in rates:
                covered = min(self.window_s, horizon_s - start)
                if covered > 0:
                    out.append((start, rates[name], total / covered))
        out.extend((start, name, value) for (start, name), value in sorted(self.maxima.items()))
        return out
