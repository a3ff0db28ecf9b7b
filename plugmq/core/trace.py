"""Message trace records: what the trace plugin writes to ``RMQ_SYS_TRACE_TOPIC`` and the admin reads.

One trace message holds a batch of :class:`TraceEvent` (JSON lines) and carries, as its keys, the
unique ids (the ids clients see) of the messages the events are about, so the store's key index
finds every batch that mentions a message. A message's retry, dead-letter and re-driven copies keep
its unique id, so one id leads to its whole path. The writer (``plugmq.plugins.trace``) and the
reader (``plugmq admin trace``, the console) share this module and nothing else.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from plugmq.core.errors import ValidationError

__all__ = ["TraceEvent", "TraceKind", "decode_trace_batch", "encode_trace_batch", "encode_trace_rows"]

class TraceKind(enum.Enum):
    """The steps of a message's path, in the order a message usually takes them."""

    STORED = "stored"  # on a topic consumers read: a send, a retry or DLQ copy, a write-back, a re-drive copy
    DELIVERED = "delivered"  # handed to a consumer of a group
    ACKED = "acked"  # the group is done with it
    NACKED = "nacked"  # a pop consumer gave up on it for now (it comes back after the back-off)
    INVISIBLE_CHANGED = "invisible_changed"  # a pop consumer asked for more (or less) time
    RETRIED = "retried"  # sent to be consumed again later (retry topic, or pop back-off)
    DEAD_LETTERED = "dead_lettered"  # retries exhausted: moved to the group's dead-letter topic
    REDRIVEN = "redriven"  # an operator sent the dead letter back


@attrs.frozen
class TraceEvent:
    """One step of one message on one broker.

    ``seq`` orders the events one broker recorded (a broker numbers them as they happen);
    ``at_ms`` is the broker clock's time. ``msg_id`` is the offset id of the copy the step is
    about (a retry or dead-letter copy has its own). ``detail`` holds the step's own facts
    (``born_host``, ``invisible_ms``, ``to_topic``...), all strings or numbers.
    """

    seq: int
    at_ms: int
    kind: TraceKind = attrs.field(converter=TraceKind)
    broker: str
    unique_id: str
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    group: str = ""
    client: str = ""
    attempt: int = 0
    detail: Mapping[str, Any] = attrs.field(factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self, value_serializer=_plain), "kind": self.kind.value}


def _plain(_instance: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, TraceKind):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    return value


_FIELDS = tuple(field.name for field in attrs.fields(TraceEvent))
_ROW_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_trace_rows(rows: Iterable[Sequence[Any]]) -> bytes:
    """Events given as rows (the fields of :class:`TraceEvent` in order, the kind as its value) as JSON
    lines: what the trace plugin's writer makes without building events."""
    dumps = _ROW_ENCODER.encode
    return "\n".join(dumps(row) for row in rows).encode()


def encode_trace_batch(events: Iterable[TraceEvent]) -> bytes:
    """Events as JSON lines (one compact array per event, fields in declaration order)."""
    return encode_trace_rows([e.seq, e.at_ms, e.kind.value, e.broker, e.unique_id, e.msg_id, e.topic, e.queue_id,
                              e.queue_offset, e.group, e.client, e.attempt, dict(e.detail)] for e in events)


def decode_trace_batch(body: bytes, unique_id: str | None = None) -> list[TraceEvent]:
    """The events of one trace message (only those about ``unique_id`` when given: the other lines are
    skipped undecoded); ValidationError names the line that is not an event."""
    events = []
    wanted = json.dumps(unique_id) if unique_id is not None else ""
    for number, line in enumerate(body.decode("utf-8", errors="replace").splitlines(), 1):
        if not line or wanted not in line:
            continue
        try:
            values = json.loads(line)
            if not isinstance(values, list) or len(values) != len(_FIELDS):
                raise ValueError(f"expected {len(_FIELDS)} fields")
            events.append(TraceEvent(**dict(zip(_FIELDS, values, strict=True))))
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"trace record line {number} is not a trace event ({exc})") from exc
    return events
