"""The admin verbs by name, with their arguments as a JSON object: what the server's endpoint and
the command line on a stopped data dir both call (:func:`execute`); times as operators write them
(:func:`parse_time`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from plugmq.admin import delayed, deletion, insight, messaging
from plugmq.admin.operations import BrokerAdmin
from plugmq.admin.values import to_json
from plugmq.config.limits import rate_limit
from plugmq.core.errors import ValidationError

__all__ = ["VERBS", "execute", "parse_time"]

_ROCKETMQ_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2}):(\d{3})")


def parse_time(text: str) -> int | None:
    """A time as operators write it: ``now`` (None), epoch milliseconds, ISO 8601
    (``2025-03-01T12:00:00``, local time unless it names a zone) or RocketMQ's
    ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time)."""
    value = text.strip()
    if value.lower() == "now":
        return None
    if value.isdigit():
        return int(value)
    match = _ROCKETMQ_TIME.fullmatch(value)
    try:
        if match:
            y, mo, d, h, mi, s, ms = (int(g) for g in match.groups())
            moment = datetime(y, mo, d, h, mi, s, ms * 1000)
        else:
            moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValidationError(f"time {text!r} is not understood; use 'now', epoch milliseconds, ISO 8601 "
                              "('2025-03-01T12:00:00', local time unless a zone is given) or "
                              "'yyyy-MM-dd#HH:mm:ss:SSS'") from None
    return round(moment.timestamp() * 1000)


_Args = Mapping[str, Any]


def _take(args: _Args, verb: str, required: Sequence[str] = (), optional: Mapping[str, Any] | None = None
          ) -> dict[str, Any]:
    optional = optional or {}
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        raise ValidationError(f"{verb}: unknown argument(s) {', '.join(unknown)}; it takes "
                              f"{', '.join([*required, *optional]) or 'none'}")
    missing = [name for name in required if args.get(name) in (None, "")]
    if missing:
        raise ValidationError(f"{verb}: missing argument(s) {', '.join(missing)}")
    return {**optional, **args}


def _int_or_none(verb: str, name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValidationError(f"{verb}: {name} must be an integer (epoch milliseconds) or null, got {value!r}")


def _topic_list(admin: BrokerAdmin, args: _Args) -> Any:
    _take(args, "topic-list")
    return admin.topic_list()


def _topic_status(admin: BrokerAdmin, args: _Args) -> Any:
    return admin.topic_status(_take(args, "topic-status", ["topic"])["topic"])


def _update_topic(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "update-topic", ["topic", "queue_count"])
    return admin.update_topic(a["topic"], a["queue_count"])


def _consumer_progress(admin: BrokerAdmin, args: _Args) -> Any:
    group = _take(args, "consumer-progress", optional={"group": None})["group"]
    return admin.consumer_groups() if group is None else admin.consumer_progress(group)


def _query_msg(admin: BrokerAdmin, args: _Args) -> Any:
    verb = "query-msg"
    a = _take(args, verb, optional={"id": None, "key": None, "topic": None, "begin_ms": None, "end_ms": None,
                                    "max": 64})
    begin, end = _int_or_none(verb, "begin_ms", a["begin_ms"]), _int_or_none(verb, "end_ms", a["end_ms"])
    chosen = [name for name in ("id", "key") if a[name]] + (["time"] if begin is not None and not a["key"] else [])
    if len(chosen) != 1:
        raise ValidationError(f"{verb}: give exactly one of an id, a key (with a topic) or a begin time (with a "
                              f"topic), not {' and '.join(chosen) or 'none'}")
    if a["id"]:
        return admin.query_by_id(a["id"], a["topic"])
    if not a["topic"]:
        raise ValidationError(f"{verb}: a query by {'key' if a['key'] else 'time'} needs a topic")
    if a["key"]:
        return admin.query_by_key(a["topic"], a["key"], begin_ms=begin or 0, end_ms=end, max_results=a["max"])
    assert begin is not None
    return admin.query_by_time(a["topic"], begin, end, a["max"])


def _reset_offset(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "reset-offset", ["group", "topic"], {"timestamp_ms": None, "force": True})
    if not isinstance(a["force"], bool):
        raise ValidationError(f"reset-offset: force must be true or false, got {a['force']!r}")
    timestamp = _int_or_none("reset-offset", "timestamp_ms", a["timestamp_ms"])
    return admin.reset_offset(a["group"], a["topic"], timestamp, force=a["force"])


def _resend_dlq(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "resend-dlq", ["group"], {"ids": [], "limit": 1000, "target": "topic"})
    ids = a["ids"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValidationError(f"resend-dlq: ids must be a list of message ids, got {ids!r}")
    return admin.resend_dlq(a["group"], ids=ids, limit=a["limit"], target=a["target"])


def _broker_status(admin: BrokerAdmin, args: _Args) -> Any:
    _take(args, "broker-status")
    return admin.broker_status()


def _trace(admin: BrokerAdmin, args: _Args) -> Any:
    return insight.message_trace(admin.broker, _take(args, "trace", ["id"])["id"])


def _group_inflight(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "group-inflight", ["group"], {"limit": 1000})
    return insight.group_inflight(admin.broker, a["group"], a["limit"])


def _group_clients(admin: BrokerAdmin, args: _Args) -> Any:
    return insight.group_clients(admin.broker, admin.clients, _take(args, "group-clients", ["group"])["group"])


def _dlq_browse(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "dlq-browse", ["group"], {"offset": None, "limit": 50})
    return insight.dlq_browse(admin.broker, a["group"], _int_or_none("dlq-browse", "offset", a["offset"]), a["limit"])


def _delay_cancel(admin: BrokerAdmin, args: _Args) -> Any:
    return delayed.cancel_delayed(admin.broker, _take(args, "delay-cancel", ["id"])["id"])


def _delay_reschedule(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "delay-reschedule", ["id", "deliver_at_ms"])
    at = _int_or_none("delay-reschedule", "deliver_at_ms", a["deliver_at_ms"])
    assert at is not None
    return delayed.reschedule_delayed(admin.broker, a["id"], at)


def _group_delete(admin: BrokerAdmin, args: _Args) -> Any:
    return deletion.delete_group(admin.broker, admin.clients, _take(args, "group-delete", ["group"])["group"])


def _topic_delete(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "topic-delete", ["topic"], {"group_topic": False})
    if not isinstance(a["group_topic"], bool):
        raise ValidationError(f"topic-delete: group_topic must be true or false, got {a['group_topic']!r}")
    return deletion.delete_topic(admin.broker, admin.clients, a["topic"], group_topic=a["group_topic"])


def _rate_limits(admin: BrokerAdmin, args: _Args) -> Any:
    _take(args, "rate-limits")
    return admin.broker.rate_limits.views()


def _rate_limit(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "rate-limit", ["kind", "name"], {"messages_per_s": None, "bytes_per_s": None, "burst_s": 1.0})
    kind = a["kind"] if str(a["kind"]).endswith("s") else f"{a['kind']}s"  # "group" or "groups"
    if a["messages_per_s"] is None and a["bytes_per_s"] is None:
        admin.broker.rate_limits.set(kind, a["name"], None)
    else:
        limit = rate_limit({k: a[k] for k in ("messages_per_s", "bytes_per_s", "burst_s") if a[k] is not None},
                           path=f"rate-limit {kind}.{a['name']}")
        admin.broker.rate_limits.set(kind, a["name"], limit)
    return admin.broker.rate_limits.views()


def _send_message(admin: BrokerAdmin, args: _Args) -> Any:
    verb = "send-message"
    a = _take(args, verb, ["topic"], {"body": "", "body_encoding": "utf-8", "tags": None, "keys": [],
                                      "properties": {}, "deliver_at_ms": None, "message_group": None,
                                      "priority": None})
    if not isinstance(a["body"], str):
        raise ValidationError(f"{verb}: body must be a string (text, or base64 with body_encoding), got {a['body']!r}")
    keys, properties = a["keys"], a["properties"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValidationError(f"{verb}: keys must be a list of strings, got {keys!r}")
    if not isinstance(properties, Mapping) or not all(isinstance(v, str) for v in properties.values()):
        raise ValidationError(f"{verb}: properties must be an object of strings, got {properties!r}")
    return messaging.send_message(admin.broker, a["topic"], a["body"], body_encoding=a["body_encoding"],
                                  tags=a["tags"], keys=tuple(keys), properties=properties,
                                  deliver_at_ms=_int_or_none(verb, "deliver_at_ms", a["deliver_at_ms"]),
                                  message_group=a["message_group"], priority=a["priority"])


def _consume_message(admin: BrokerAdmin, args: _Args) -> Any:
    a = _take(args, "consume-message", ["topic"],
              {"group": messaging.CONSOLE_GROUP, "count": 1, "from_first": True, "wait_s": 0})
    if not isinstance(a["from_first"], bool):
        raise ValidationError(f"consume-message: from_first must be true or false, got {a['from_first']!r}")
    return messaging.consume_messages(admin.broker, a["topic"], a["group"], a["count"], from_first=a["from_first"],
                                      wait_s=a["wait_s"])


VERBS = {
    "topic-list": _topic_list,
    "topic-status": _topic_status,
    "update-topic": _update_topic,
    "consumer-progress": _consumer_progress,
    "query-msg": _query_msg,
    "reset-offset": _reset_offset,
    "resend-dlq": _resend_dlq,
    "broker-status": _broker_status,
    "trace": _trace,
    "group-inflight": _group_inflight,
    "group-clients": _group_clients,
    "dlq-browse": _dlq_browse,
    "delay-cancel": _delay_cancel,
    "delay-reschedule": _delay_reschedule,
    "group-delete": _group_delete,
    "topic-delete": _topic_delete,
    "rate-limits": _rate_limits,
    "rate-limit": _rate_limit,
    "send-message": _send_message,
    "consume-message": _consume_message,
}
"""Every admin verb: its name (``plugmq admin <name>``) -> a function of the admin and the verb's
arguments (a JSON object), returning admin values. The server's endpoint and the CLI on a stopped
data dir both call :func:`execute`."""


def execute(admin: BrokerAdmin, verb: str, args: _Args) -> Any:
    """Run ``verb`` with ``args``; returns the JSON-ready result."""
    function = VERBS.get(verb)
    if function is None:
        raise ValidationError(f"admin verb {verb!r} is unknown; known: {', '.join(VERBS)}")
    if not isinstance(args, Mapping):
        raise ValidationError(f"{verb}: arguments must be a JSON object, got {type(args).__name__}")
    return to_json(function(admin, args))
