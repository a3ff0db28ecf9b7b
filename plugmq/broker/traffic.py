"""What passes through a broker: messages and bytes in per topic, out per topic and group, and how
long store appends take. Kept by the broker on its send and pull paths; read by metrics exporters.

The hot path takes no lock: every thread counts into its own tables (a ``threading.local``), and a
snapshot adds the tables of every thread up (folding those of finished threads into one). A send
pays one call: a dict lookup, a few integer additions and a bucket search; never a store read or a
hook call. The compiled plain put (plugmq.kit.requestcodec.put_one) counts into lists shared by
all threads instead (:meth:`Traffic.shared_sends`): it holds the GIL from read to write, so each
update is atomic without a lock. Everything else (lag, in-flight, disk use) is computed when someone asks.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence

import attrs

from plugmq.core.message import StoredMessage

__all__ = ["APPEND_LATENCY_BUCKETS_S", "LatencySnapshot", "SharedSends", "Traffic", "TrafficSnapshot"]

#: A topic's send counters shared by all threads: [messages, body bytes] of normal and of fifo
#: sends, the append latency's bucket counts followed by their sum in seconds, and the edges.
SharedSends = tuple[list[int], list[int], list[float], tuple[float, ...]]

# Upper bucket edges in seconds: a page-cache append takes microseconds, a synchronous flush on a
# slow disk tens of milliseconds, a stalled one seconds.
APPEND_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
)


@attrs.frozen
class LatencySnapshot:
    """Counts per bucket (``counts[i]``: observations <= ``edges[i]`` and above the edge before; the
    last one above every edge), their sum in seconds and how many there were."""

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


@attrs.frozen
class TrafficSnapshot:
    """Totals since the broker opened.

    ``messages_in`` / ``bytes_in``: (topic, message type) -> messages sent and their body bytes;
    the type is RocketMQ's label: ``normal``, ``fifo`` (a message group), ``delay``, and
    ``duplicate`` for sends a dedup window answered with their first copy (nothing stored).
    ``messages_out`` / ``bytes_out``: (topic, consumer group) -> messages handed to consumers
    (pulled, popped, redelivered) and their body bytes. ``append_latency``: the broker's store
    calls (one per append or batch append).
    """

    messages_in: Mapping[tuple[str, str], int]
    bytes_in: Mapping[tuple[str, str], int]
    messages_out: Mapping[tuple[str, str], int]
    bytes_out: Mapping[tuple[str, str], int]
    append_latency: LatencySnapshot


class _Tables:
    """One thread's counts. Only its thread writes; snapshots read (whole-dict copies under the GIL)."""

    def __init__(self, buckets: int) -> None:
        self.thread = threading.current_thread()
        self.ins: dict[tuple[str, str], list[int]] = {}
        self.outs: dict[tuple[str, str], list[int]] = {}
        self.latency = [0] * buckets
        self.latency_sum = 0.0

    def add_into(self, other: _Tables) -> None:
        for mine, theirs in ((self.ins, other.ins), (self.outs, other.outs)):
            for key, (count, size) in list(mine.items()):
                entry = theirs.setdefault(key, [0, 0])
                entry[0] += count
                entry[1] += size
        other.latency = [a + b for a, b in zip(other.latency, list(self.latency), strict=True)]
        other.latency_sum += self.latency_sum


class Traffic:
    """The broker's counters. Thread-safe without locks on the counting path."""

    def __init__(self, edges: tuple[float, ...] = APPEND_LATENCY_BUCKETS_S) -> None:
        self._edges = edges
        self._lock = threading.Lock()  # registration and snapshots only
        self._tables: list[_Tables] = []
        self._finished = _Tables(len(edges) + 1)  # what finished threads counted
        self._local = threading.local()
        self._shared: dict[str, tuple[list[int], list[int]]] = {}  # topic -> normal, fifo [messages, bytes]
        self._shared_latency: list[float] = [0] * (len(edges) + 1) + [0.0]  # bucket counts, then the sum

    def _mine(self) -> _Tables:
        try:
            return self._local.tables
        except AttributeError:
            tables = _Tables(len(self._edges) + 1)
            with self._lock:
                self._tables.append(tables)
            self._local.tables = tables
            return tables

    def sent(self, topic: str, message_type: str, count: int, body_bytes: int, append_s: float | None = None) -> None:
        """``count`` messages of ``topic`` with ``body_bytes`` in all were accepted from producers;
        ``append_s``: how long the store call that took them lasted (None: no store call, e.g. a
        delayed message handed to the delay plugin)."""
        tables = self._mine()
        entry = tables.ins.get((topic, message_type))
        if entry is None:
            entry = tables.ins[(topic, message_type)] = [0, 0]
        entry[0] += count
        entry[1] += body_bytes
        if append_s is not None:
            tables.latency[bisect.bisect_left(self._edges, append_s)] += 1
            tables.latency_sum += append_s

    def shared_sends(self, topic: str) -> SharedSends:
        """``topic``'s counters for a compiled put, shared by all threads (see the module doc)."""
        with self._lock:
            entries = self._shared.get(topic)
            if entries is None:
                entries = self._shared[topic] = ([0, 0], [0, 0])
        return entries[0], entries[1], self._shared_latency, self._edges

    def _add_shared(self, total: _Tables) -> None:
        for topic, entries in list(self._shared.items()):
            for kind, (count, size) in zip(("normal", "fifo"), (list(e) for e in entries), strict=True):
                if count:
                    entry = total.ins.setdefault((topic, kind), [0, 0])
                    entry[0] += count
                    entry[1] += size
        latency = list(self._shared_latency)
        total.latency = [int(a + b) for a, b in zip(total.latency, latency[:-1], strict=True)]
        total.latency_sum += latency[-1]

    def appended(self, seconds: float) -> None:
        """A store call made for no producer (a delayed or committed message written back) took ``seconds``."""
        tables = self._mine()
        tables.latency[bisect.bisect_left(self._edges, seconds)] += 1
        tables.latency_sum += seconds

    def delivered(self, group: str, messages: Sequence[StoredMessage]) -> None:
        """``messages`` were handed to consumers of ``group``."""
        outs = self._mine().outs
        if not messages:
            return
        topic = messages[0].topic
        if all(message.topic == topic for message in messages):  # one queue's pull: counted at once
            entry = outs.get((topic, group))
            if entry is None:
                entry = outs[(topic, group)] = [0, 0]
            entry[0] += len(messages)
            entry[1] += sum(len(message.body) for message in messages)
            return
        for message in messages:
            entry = outs.get((message.topic, group))
            if entry is None:
                entry = outs[(message.topic, group)] = [0, 0]
            entry[0] += 1
            entry[1] += len(message.body)

    def snapshot(self) -> TrafficSnapshot:
        with self._lock:
            for tables in [t for t in self._tables if not t.thread.is_alive()]:
                tables.add_into(self._finished)  # its thread is gone: nothing writes these any more
                self._tables.remove(tables)
            total = _Tables(len(self._edges) + 1)
            for tables in (self._finished, *self._tables):
                tables.add_into(total)
            self._add_shared(total)
        return TrafficSnapshot(
            messages_in={k: v[0] for k, v in total.ins.items()},
            bytes_in={k: v[1] for k, v in total.ins.items()},
            messages_out={k: v[0] for k, v in total.outs.items()},
            bytes_out={k: v[1] for k, v in total.outs.items()},
            append_latency=LatencySnapshot(self._edges, tuple(total.latency), total.latency_sum, sum(total.latency)),
        )
