"""One broker's trace recorder: events queued on the hot path, written in batches by a thread of its own.

The event hooks run in the threads that send and consume, so recording costs one tuple and one
``deque.append`` (both atomic in CPython: no lock on the send path). A writer thread wakes every
``flush_interval_ms`` on the broker's clock, or as soon as a batch is full, and appends the queued
events as trace messages (``batch_events`` events each) to ``RMQ_SYS_TRACE_TOPIC`` in one store
batch. When the writer falls behind by ``max_pending`` events, new events are dropped and counted
rather than holding up a send; when the broker cannot write (a slave, a full disk) the batch is
dropped, counted and logged, and recording goes on.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from plugmq.core import Clock, PlugmqError, SystemTopicWriter, ValidationError, encode_msg_id, get_logger
from plugmq.core.names import TRACE_TOPIC
from plugmq.core.trace import TraceKind, encode_trace_rows

__all__ = ["PendingEvent", "Recorder", "TraceOptions"]

log = get_logger(__name__)


@attrs.frozen
class TraceOptions:
    """``[plugins.trace]``: how the recorder batches, how far it may fall behind, whether it makes spans.

    ``spans``: make OpenTelemetry spans for send, store and deliver when the application configured
    an OpenTelemetry tracer provider (and ``opentelemetry-api`` is installed); off costs nothing.
    """

    flush_interval_ms: int = attrs.field(default=200, validator=[attrs.validators.ge(1),
                                                                attrs.validators.le(60_000)])
    batch_events: int = attrs.field(default=128, validator=[attrs.validators.ge(1), attrs.validators.le(1024)])
    max_pending: int = attrs.field(default=200_000, validator=attrs.validators.ge(1))
    spans: bool = True


# seq, at_ms, kind, unique_id, msg_id, topic, queue_id, queue_offset, group, client, attempt, detail, trace context,
# born ms, store ms: what the hot path captures of an event (plain values, never the message and its body).
PendingEvent = tuple[int, int, TraceKind, str, tuple[str, int], str, int, int, str, str, int, Mapping[str, Any],
                     str | None, int, int]

SpanSink = Callable[[list[PendingEvent]], None]


class Recorder:
    """Queues one broker's events and writes them to its trace topic."""

    def __init__(self, broker_name: str, clock: Clock, options: TraceOptions, spans: SpanSink | None = None) -> None:
        self.broker_name = broker_name
        self.clock = clock
        self.options = options
        self._spans = spans
        self._pending: deque[PendingEvent] = deque()
        self._seq = itertools.count(1)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # one drain at a time: the thread's and a flush()'s
        self._writer: SystemTopicWriter | None = None
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0
        self._failures = 0
        self._prefixes: dict[str, str] = {}

    # ------------------------------------------------------------------------------ hot path
    def next_seq(self) -> int:
        return next(self._seq)

    def add(self, event: PendingEvent) -> None:
        """Queue one event (called by the hooks, in the sending and consuming threads)."""
        pending = self._pending
        if len(pending) >= self.options.max_pending:
            self.dropped += 1  # a lost increment under a race only undercounts drops; never blocks a send
            return
        pending.append(event)
        if len(pending) >= self.options.batch_events:
            self._wake.set()

    # ------------------------------------------------------------------------------ writer
    def start(self, writer: SystemTopicWriter) -> None:
        self._writer = writer
        try:
            writer.append_system_records(TRACE_TOPIC, [])  # the topic exists from now on: readers know we record
        except PlugmqError as exc:  # a slave: its master's records arrive by replication
            log.info("trace topic not created here", broker=self.broker_name, reason=str(exc))
        self._thread = threading.Thread(target=self._run, name=f"plugmq-trace-{self.broker_name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = self.options.flush_interval_ms / 1000
        while not self._stop.is_set():
            self.clock.wait(self._wake, interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:
                log.exception("trace batch failed; recording goes on", broker=self.broker_name)

    def flush(self) -> int:
        """Write every queued event now; returns how many were written."""
        with self._write_lock:
            taken: list[PendingEvent] = []
            pending = self._pending
            for _ in range(len(pending)):
                taken.append(pending.popleft())
            if not taken:
                return 0
            taken.sort(key=lambda e: e[0])
            if self._spans is not None:
                self._spans(taken)
            return self._write(taken)

    def _write(self, taken: list[PendingEvent]) -> int:
        writer = self._writer
        if writer is None:
            self.dropped += len(taken)
            return 0
        size = self.options.batch_events
        records = []
        for start in range(0, len(taken), size):
            rows = [self._row(event) for event in taken[start:start + size]]
            keys = list(dict.fromkeys(row[4] for row in rows))
            records.append((encode_trace_rows(rows), keys))
        try:
            writer.append_system_records(TRACE_TOPIC, records)
        except PlugmqError as exc:
            self.dropped += len(taken)
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("trace events dropped: the broker did not store them", broker=self.broker_name,
                            events=len(taken), error=str(exc), failures=self._failures)
            return 0
        self.written += len(taken)
        return len(taken)

    def _row(self, event: PendingEvent) -> list[Any]:
        """A queued event as the trace record's row (:func:`plugmq.core.trace.encode_trace_rows`)."""
        seq, at_ms, kind, unique_id, (store_host, offset), topic, queue_id, queue_offset, group, client, attempt, \
            detail = event[:12]
        prefix = self._prefixes.get(store_host)
        if prefix is None:
            prefix = self._prefixes[store_host] = _msg_id_prefix(store_host)
        msg_id = f"{prefix}{offset:016X}" if prefix else str(offset)
        return [seq, at_ms, kind.value, self.broker_name, unique_id or msg_id, msg_id, topic, queue_id, queue_offset,
                group, client, attempt, detail]

    def stop(self) -> None:
        """Write what is queued and stop the writer (the broker is stopping; its store is still open)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.flush()
        except Exception:
            log.exception("last trace batch failed", broker=self.broker_name)
        self._writer = None
        if self.dropped:
            log.warning("trace events were dropped while the broker ran", broker=self.broker_name,
                        dropped=self.dropped, written=self.written)


def _msg_id_prefix(store_host: str) -> str:
    try:
        return encode_msg_id(store_host, 0)[:16]  # IPv4 and port: the offset follows as 16 hex digits
    except ValidationError:  # a store whose hosts are not IPv4:port: the offset alone still places it
        return ""
