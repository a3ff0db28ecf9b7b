"""Per-topic settings: the ``[topics]`` table (dedup window, priority).

::

    [topics]                      # every topic's defaults (system topics never dedup)
    dedup_window_s = 600

    [topics.Orders]               # one topic (keys it leaves out: the defaults above)
    dedup = true                  # a retried send inside the window is stored once
    dedup_by = "id"               # the message id (official clients resend it); "keys": the message's keys

    [topics.Tasks]
    priority = true               # RIP-80: priority p goes to queue min(p, queues - 1); higher queues first

``dedup_by = "id"`` deduplicates by the message's unique id: what the official RocketMQ clients
send again when they retry a send whose answer they did not get. ``"keys"`` deduplicates by the
message's business keys (``Message(keys=...)``, all of them together), for producers that name a
message by what it is (an order id) and may send it again themselves: a Python application
retrying after an error, a batch job run twice.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, InvalidNameError
from plugmq.core.names import is_system_topic, validate_topic

__all__ = ["DEDUP_BY", "TOPIC_KEYS", "TopicSettings", "TopicSettingsTable", "parse_topics_table"]

DEDUP_BY = ("id", "keys")
MAX_DEDUP_WINDOW_S = 7 * 24 * 3600.0


@attrs.frozen
class TopicSettings:
    """What one topic decides: dedup of retried sends within a window, priority delivery."""

    dedup: bool = False
    dedup_window_s: float = 600.0
    dedup_by: str = "id"
    priority: bool = False

    @property
    def dedup_window_ms(self) -> int:
        return round(self.dedup_window_s * 1000)


@attrs.frozen
class TopicSettingsTable:
    """The defaults of ``[topics]`` and the topics configured in it."""

    default: TopicSettings = attrs.field(factory=TopicSettings)
    topics: Mapping[str, TopicSettings] = attrs.field(factory=dict)

    def settings(self, topic: str) -> TopicSettings:
        found = self.topics.get(topic)
        if found is not None:
            return found
        return TopicSettings() if is_system_topic(topic) else self.default

    def dedup(self, topic: str) -> TopicSettings | None:
        """The topic's settings when it deduplicates, else None (cheap: sends ask on every put)."""
        settings = self.settings(topic)
        return settings if settings.dedup else None

    @property
    def any_dedup(self) -> bool:
        return self.default.dedup or any(s.dedup for s in self.topics.values())


TOPIC_KEYS = tuple(f.name for f in attrs.fields(TopicSettings))


def _value(path: str, key: str, value: Any) -> Any:
    where = f"{path}.{key}"
    if key in ("dedup", "priority"):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if key == "dedup_window_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DEDUP_WINDOW_S:
            raise ConfigError(f"{where} must be a number of seconds in (0, {MAX_DEDUP_WINDOW_S:g}] (a week), "
                              f"got {value!r}")
        return float(value)
    if key == "dedup_by":
        if value not in DEDUP_BY:
            raise ConfigError(f"{where} must be one of {', '.join(repr(v) for v in DEDUP_BY)}, got {value!r}")
        return value
    close = difflib.get_close_matches(key, TOPIC_KEYS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{where}: unknown key.{hint} Known keys: {', '.join(TOPIC_KEYS)}")


def _settings(path: str, table: Mapping[str, Any], base: TopicSettings) -> TopicSettings:
    return attrs.evolve(base, **{key: _value(path, key, value) for key, value in table.items()})


def parse_topics_table(table: Any, *, path: str = "topics") -> TopicSettingsTable:
    """Validate a ``[topics]`` table: scalar keys are every topic's defaults, sub-tables are topics."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path} must be a table, got {table!r}")
    defaults = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    default = _settings(path, defaults, TopicSettings())
    topics: dict[str, TopicSettings] = {}
    for name, entry in table.items():
        if name in defaults:
            continue
        where = f"{path}.{name}"
        try:
            validate_topic(name)
        except InvalidNameError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if is_system_topic(name):
            raise ConfigError(f"{where}: {name!r} is a system topic; dedup and priority are for producers' topics")
        topics[name] = _settings(where, entry, default)
    return TopicSettingsTable(default, topics)
