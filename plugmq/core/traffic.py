"""What passes through a broker: messages and bytes in per topic, out per topic and group, and how
long store appends take. Kept by the broker on its send and pull paths; read by metrics exporters.

The hot path pays one uncontended lock and a few integer additions per call (a send, a batch, a
pull that found messages), never a store read or a hook call; everything else (lag, in-flight,
disk use) is computed when someone asks.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping

import attrs

from plugmq.core.message import StoredMessage

__all__ = ["APPEND_LATENCY_BUCKETS_S", "LatencyHistogram", "LatencySnapshot", "Traffic", "TrafficSnapshot"]

# Upper bucket edges in seconds: a page-cache append takes tens of microseconds, a synchronous
# flush on a slow disk tens of milliseconds, a stalled one seconds.
APPEND_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)


@attrs.frozen
class LatencySnapshot:
    """Counts per bucket (``counts[i]``: observations <= ``edges[i]``, the last one above every edge,
    not cumulative), their sum in seconds and how many there were."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float
    count: int

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper edge, observations at or below it) pairs ending with (+inf, count): Prometheus' buckets."""
        out: list[tuple[float, int]] = []
        seen = 0
        for edge, n in zip((*self.edges, float("inf")), self.counts, strict=True):
            seen += n
            out.append((edge, seen))
        return out


class LatencyHistogram:
    """Fixed-bucket histogram of durations in seconds; memory does not grow with use. Not locked:
    the caller holds its own lock around :meth:`record`."""

    def __init__(self, edges: tuple[float, ...] = APPEND_LATENCY_BUCKETS_S) -> None:
        self._edges = edges
        self._counts = [0] * (len(edges) + 1)
        self._sum = 0.0
        self._count = 0

    def record(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self._edges, seconds)] += 1
        self._sum += seconds
        self._count += 1

    def snapshot(self) -> LatencySnapshot:
        return LatencySnapshot(self._edges, tuple(self._counts), self._sum, self._count)


@attrs.frozen
class TrafficSnapshot:
    """Totals since the broker opened.

    ``messages_in`` / ``bytes_in``: (topic, message type) -> messages sent and their body bytes;
    the type is RocketMQ's label: ``normal``, ``fifo`` (a message group), ``delay``.
    ``messages_out`` / ``bytes_out``: (topic, consumer group) -> messages handed to consumers
    (pulled, popped, redelivered) and their body bytes. ``append_latency``: the broker's store calls (one per append or batch append).
    """

    messages_in: Mapping[tuple[str, str], int]
    bytes_in: Mapping[tuple[str, str], int]
    messages_out: Mapping[tuple[str, str], int]
    bytes_out: Mapping[tuple[str, str], int]
    append_latency: LatencySnapshot


class Traffic:
    """The broker's counters. Thread-safe; every method is O(messages) with one lock taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in: dict[tuple[str, str], list[int]] = {}
        self._out: dict[tuple[str, str], list[int]] = {}
        self._append = LatencyHistogram()

    def sent(self, topic: str, message_type: str, count: int, body_bytes: int) -> None:
        """``count`` messages of ``topic`` with ``body_bytes`` in all were accepted from producers."""
        key = (topic, message_type)
        with self._lock:
            entry = self._in.get(key)
            if entry is None:
                entry = self._in[key] = [0, 0]
            entry[0] += count
            entry[1] += body_bytes

    def delivered(self, group: str, messages: Iterable[StoredMessage]) -> None:
        """``messages`` were handed to consumers of ``group``."""
        with self._lock:
            for message in messages:
                key = (message.topic, group)
                entry = self._out.get(key)
                if entry is None:
                    entry = self._out[key] = [0, 0]
                entry[0] += 1
                entry[1] += len(message.body)

    def appended(self, seconds: float) -> None:
        """One store call (an append, or a batch append) took ``seconds``."""
        with self._lock:
            self._append.record(seconds)

    def snapshot(self) -> TrafficSnapshot:
        with self._lock:
            return TrafficSnapshot(
                messages_in={k: v[0] for k, v in self._in.items()},
                bytes_in={k: v[1] for k, v in self._in.items()},
                messages_out={k: v[0] for k, v in self._out.items()},
                bytes_out={k: v[1] for k, v in self._out.items()},
                append_latency=self._append.snapshot(),
            )
