"""What the console's pages show, assembled from the brokers' admin verbs (no web framework here)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from plugmq.console.brokers import Broker, BrokerCall, Credentials, Fleet
from plugmq.console.history import History

__all__ = ["Chart", "lag_chart", "merged_trace", "preview", "when"]

_CHART_W, _CHART_H = 640, 140
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def when(ms: int | float | None) -> str:
    """Epoch milliseconds as local time, to the millisecond ('-' for none)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def preview(text: str, limit: int = 200) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[:limit] + "…"


@attrs.frozen
class Line:
    label: str
    colour: str
    points: str  # SVG polyline points
    last: int


@attrs.frozen
class Chart:
    """A server-rendered SVG line chart of lag over time (no JavaScript)."""

    width: int
    height: int
    lines: tuple[Line, ...]
    peak: int
    span_s: float


def lag_chart(history: History, group: str) -> Chart | None:
    """One line per (broker, topic, queue) of ``group``'s sampled lag; None before two samples."""
    series = {key: points for key, points in history.lag_series(group).items() if points}
    if not series or max(len(p) for p in series.values()) < 2:
        return None
    start = min(p[0][0] for p in series.values())
    end = max(p[-1][0] for p in series.values())
    span = max(end - start, 1e-3)
    peak = max(1, max(v for p in series.values() for _, v in p))
    lines = []
    for i, ((broker, topic, queue), points) in enumerate(sorted(series.items())):
        coords = " ".join(f"{(t - start) / span * _CHART_W:.1f},{_CHART_H - v / peak * (_CHART_H - 4):.1f}"
                          for t, v in points)
        lines.append(Line(f"{broker} {topic}#{queue}", _COLOURS[i % len(_COLOURS)], coords, points[-1][1]))
    return Chart(_CHART_W, _CHART_H, tuple(lines), peak, span)


def merged_trace(calls: Sequence[BrokerCall]) -> list[dict[str, Any]]:
    """Every broker's steps of one message, in time order (a broker's own steps keep their order)."""
    events: list[tuple[int, int, int, dict[str, Any]]] = []
    for index, call in enumerate(calls):
        if call.error is None and call.result:
            for position, event in enumerate(call.result["events"]):
                events.append((event["at_ms"], index, position, event))
    events.sort(key=lambda row: (row[0], row[1], row[2]))
    return [event for *_, event in events]


def where_group_lives(fleet: Fleet, brokers: Sequence[Broker], group: str,
                      credentials: Credentials | None) -> list[BrokerCall]:
    """``consumer-progress`` of ``group`` on every broker it consumed from (a broker that fails to
    answer stays in, with its error)."""
    out = []
    for listing in fleet.each(brokers, "consumer-progress", {}, credentials):
        if listing.error is not None:
            out.append(listing)
        elif any(row["group"] == group for row in listing.result):
            out.extend(fleet.each([listing.broker], "consumer-progress", {"group": group}, credentials))
    return out
