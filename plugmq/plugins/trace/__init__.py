"""trace: every message's path — delivered, acked, nacked, retried, dead-lettered, re-driven.

An observer on the broker's consume-side event hooks. Each step becomes a
:class:`~plugmq.core.trace.TraceEvent` (when, which broker, which group and client, which attempt),
written in batches to the system topic ``RMQ_SYS_TRACE_TOPIC`` with the message's unique id as key,
so ``plugmq admin trace --id`` and the console find a message's whole path (its retry, dead-letter
and re-driven copies keep the id). The *stored* steps are not recorded: the store holds every copy
with its store time, born host and properties already, and the trace verb reads them from there.
So the plugin implements no ``plugmq_message_stored`` and a send does no trace work at all.
The trace topic lives in the commit log like any topic and goes with the store's retention
(``file_reserved_time``); the plugin holds no retention floor, so traces never keep data alive.
With OpenTelemetry configured by the application (``pip install 'plugmq[trace]'``), send, store
and deliver become spans parented on the message's ``trace_context`` (see :mod:`.spans`).

Enable it by listing ``trace`` in ``broker.plugins``; options in ``[plugins.trace]``
(:class:`TraceOptions`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from plugmq.core import (
    Family,
    PluginContext,
    PluginDeclaration,
    Prop,
    StoredMessage,
    SystemTopicWriter,
    get_logger,
    hookimpl,
)
from plugmq.core.trace import TraceKind
from plugmq.plugins.trace.recorder import Recorder, TraceOptions
from plugmq.plugins.trace.spans import span_maker

__all__ = ["TraceOptions", "recorder"]

log = get_logger(__name__)

_lock = threading.Lock()
_recorders: dict[str, Recorder] = {}  # broker name -> its recorder, from configure to stopping
_EMPTY: Mapping[str, Any] = {}


def recorder(broker_name: str) -> Recorder | None:
    """The recorder of a running broker of this process (tests flush it; the CLI reads its counts)."""
    with _lock:
        return _recorders.get(broker_name)


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(name="trace", families={Family.EVENTS}, options=TraceOptions,
                             description="message trace: each message's path in RMQ_SYS_TRACE_TOPIC, "
                                         "OpenTelemetry spans when configured")


@hookimpl
def plugmq_configure(context: PluginContext) -> None:
    options = context.options_for("trace") or TraceOptions()
    spans = span_maker() if options.spans else None
    made = Recorder(context.broker_name, context.clock, options, spans)
    with _lock:
        _recorders[context.broker_name] = made


@hookimpl
def plugmq_broker_started(broker_name: str, system_writer: SystemTopicWriter) -> None:
    found = recorder(broker_name)
    if found is not None:
        found.start(system_writer)


@hookimpl
def plugmq_broker_stopping(broker_name: str) -> None:
    with _lock:
        found = _recorders.pop(broker_name, None)
    if found is not None:
        found.stop()


def _record(broker_name: str, kind: TraceKind, message: StoredMessage, group: str = "", client: str = "",
            attempt: int = 0, detail: Mapping[str, Any] = _EMPTY) -> None:
    found = _recorders.get(broker_name)  # a dict read: atomic, no lock on the hot path
    if found is None:
        return
    props = message.properties
    # The offset message id is encoded by the writer thread, from (store host, commit-log offset).
    found.add((found.next_seq(), found.clock.now_ms(), kind, props.get(Prop.UNIQ_KEY) or "",
               (message.store_host, message.commit_log_offset), message.topic, message.queue_id,
               message.queue_offset, group, client, attempt, detail, props.get(Prop.TRACE_CONTEXT),
               message.born_timestamp_ms, message.store_timestamp_ms))


@hookimpl
def plugmq_message_delivered(broker_name: str, consumer_group: str, message: StoredMessage, client_id: str,
                             attempt: int) -> None:
    _record(broker_name, TraceKind.DELIVERED, message, consumer_group, client_id, attempt)


@hookimpl
def plugmq_message_acked(broker_name: str, consumer_group: str, message: StoredMessage, client_id: str) -> None:
    _record(broker_name, TraceKind.ACKED, message, consumer_group, client_id)


@hookimpl
def plugmq_message_invisible_changed(broker_name: str, consumer_group: str, message: StoredMessage, client_id: str,
                                     invisible_ms: int, gave_up: bool) -> None:
    kind = TraceKind.NACKED if gave_up else TraceKind.INVISIBLE_CHANGED
    _record(broker_name, kind, message, consumer_group, client_id, detail={"invisible_ms": invisible_ms})


@hookimpl
def plugmq_message_retried(broker_name: str, consumer_group: str, message: StoredMessage,
                           reconsume_times: int) -> None:
    _record(broker_name, TraceKind.RETRIED, message, consumer_group, attempt=reconsume_times)


@hookimpl
def plugmq_message_dead_lettered(broker_name: str, consumer_group: str, message: StoredMessage) -> None:
    _record(broker_name, TraceKind.DEAD_LETTERED, message, consumer_group, attempt=message.reconsume_times + 1)


@hookimpl
def plugmq_message_redriven(broker_name: str, consumer_group: str, message: StoredMessage, copy_msg_id: str,
                            topic: str) -> None:
    _record(broker_name, TraceKind.REDRIVEN, message, consumer_group,
            detail={"copy_msg_id": copy_msg_id, "to_topic": topic})
