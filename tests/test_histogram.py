"""The one histogram and quantile definition (plugmq.kit.histogram) every reported percentile uses."""

from __future__ import annotations

import json
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.kit.histogram import BUCKETS_PER_DECADE, Histogram, bucket_of, bucket_upper_ms
from plugmq.kit.lateness import LatenessHistogram

_VALUES = st.lists(st.floats(min_value=-5, max_value=1e7, allow_nan=False), min_size=1, max_size=200)


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@settings(max_examples=100, deadline=None)
@given(_VALUES, _VALUES)
def test_merged_histograms_equal_the_histogram_of_all_values(a: list[float], b: list[float]) -> None:
    ha, hb, both = Histogram(), Histogram(), Histogram()
    ha.record_many(a)
    for v in b:
        hb.record(v)
    both.record_many(a + b)
    ha.merge(hb)
    assert ha.counts == both.counts and (ha.count, ha.max, ha.min) == (both.count, both.max, both.min)


@settings(max_examples=200, deadline=None)
@given(_VALUES, st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999, 1.0]))
def test_a_quantile_is_the_nearest_rank_read_at_its_bucket_edge(values: list[float], q: float) -> None:
    """Never below the nearest-rank value, at most one bucket (~6 %) above it; p100 is the maximum."""
    hist = Histogram()
    hist.record_many(values)
    estimate, exact = hist.quantile(q), nearest_rank(values, q)
    assert estimate is not None
    if exact <= 0:
        assert estimate == (0.0 if max(values) >= 0 else max(values))
    else:
        assert exact <= estimate <= max(exact, 1e-3) * 10 ** (1 / BUCKETS_PER_DECADE) + 1e-9
    assert hist.quantile(1.0) == max(max(values), 0.0) or max(values) < 0


def test_bucket_edges_cover_their_values() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        v = 10 ** rng.uniform(-4, 8)
        b = bucket_of(v)
        assert bucket_upper_ms(b) >= v and (b <= 1 or bucket_upper_ms(b - 1) < v)
    assert bucket_of(0) == 0 and bucket_of(-3) == 0 and bucket_upper_ms(0) == 0
    assert Histogram().quantile(0.5) is None


def test_a_histogram_crosses_a_process_boundary_as_json() -> None:
    hist = Histogram()
    for value in (0.05, 1.0, 3.3, 3.3, 950.0):
        hist.record(value)
    back = Histogram.from_json(json.loads(json.dumps(hist.to_json())))
    assert back.sparse() == hist.sparse() and (back.count, back.min, back.max) == (5, 0.05, 950.0)
    assert back.quantile(0.5) == hist.quantile(0.5)
    assert Histogram.from_json(Histogram().to_json()).count == 0


def test_every_delay_plugin_reports_lateness_the_same_way() -> None:
    """delay_level, delay_wheel and delay_schedule all report late_ms_* through LatenessHistogram.figures()."""
    import importlib

    for plugin in ("delay_level", "delay_wheel", "delay_schedule"):
        module = importlib.import_module(f"plugmq.plugins.{plugin}.scheduler")
        assert module.LatenessHistogram is LatenessHistogram, f"{plugin} reports lateness its own way"
    late = LatenessHistogram()
    late.record_many([-3, 0, 4, 5, 100])  # an early delivery counts as 0
    figures = late.figures()
    assert 4.0 <= figures.pop("late_ms_p50") <= 4.0 * 10 ** (1 / BUCKETS_PER_DECADE)
    assert figures == {"late_ms_p99": 100.0, "late_ms_max": 100.0, "late_ms_mean": 109 / 5}
    assert LatenessHistogram().figures() == dict.fromkeys(("late_ms_p50", "late_ms_p99", "late_ms_max",
                                                           "late_ms_mean"), 0.0)
