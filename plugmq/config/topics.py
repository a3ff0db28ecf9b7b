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

from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, InvalidNameError
from plugmq.core.names import is_system_topic, validate_topic
from plugmq.core.schema import Refusal, dotted, one_of, setting, shown, structure, table_keys

__all__ = ["DEDUP_BY", "TOPIC_KEYS", "TopicSettings", "TopicSettingsTable", "TopicTable", "parse_topics_table"]

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


def _window(_inst: object, _attr: object, value: float | None) -> None:
    if value is not None and not 0 < value <= MAX_DEDUP_WINDOW_S:
        raise Refusal(f"must be a number of seconds in (0, {MAX_DEDUP_WINDOW_S:g}] (a week), got {shown(value)}")


@attrs.frozen
class TopicTable:
    """The keys of ``[topics]`` (every topic's defaults) and of each ``[topics.<topic>]`` table.

    A key left out keeps the default (plugmq's, or for a topic, ``[topics]``'s). System topics
    (retry, dead-letter, ...) take none of them.
    """

    dedup: bool | None = setting(None, doc="a send whose key was stored on the topic within the window is answered "
                                           "with the first copy and not stored again (default false)")
    dedup_window_s: float | None = setting(None, doc="how long a key is remembered (default 600 s, at most a week)",
                                           expected="a number of seconds", validator=_window)
    dedup_by: str | None = setting(None, doc='the key: "id", the message id the official clients resend, or "keys", '
                                             'the message\'s keys (default "id")',
                                   expected='"id" or "keys"', validator=attrs.validators.optional(one_of(*DEDUP_BY)))
    priority: bool | None = setting(None, doc="RIP-80: priority p is stored on queue min(p, queues - 1) and the "
                                              "highest queue is read first (default false)")

    def over(self, base: TopicSettings) -> TopicSettings:
        """``base`` with the keys this table sets."""
        return attrs.evolve(base, **{k: v for k, v in attrs.asdict(self).items() if v is not None})


TOPIC_KEYS = tuple(table_keys(TopicTable))


def parse_topics_table(table: Any, *, source: str = "", path: tuple[str, ...] = ("topics",)) -> TopicSettingsTable:
    """Validate a ``[topics]`` table: scalar keys are every topic's defaults, sub-tables are topics.
    A ConfigError lists every problem, each naming its key path."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{dotted(path, source)} must be a table, got {table!r}")
    problems: list[str] = []
    default = TopicSettings()
    try:
        default = structure({k: v for k, v in table.items() if not isinstance(v, Mapping)}, TopicTable, source,
                            path).over(default)
    except ConfigError as exc:
        problems.extend(exc.problems)
    topics: dict[str, TopicSettings] = {}
    for name, entry in table.items():
        if not isinstance(entry, Mapping):
            continue
        try:
            validate_topic(name)
            if is_system_topic(name):
                problems.append(f"{dotted((*path, name), source)}: {name!r} is a system topic; dedup and priority "
                                "are for producers' topics")
                continue
            topics[name] = structure(entry, TopicTable, source, (*path, name)).over(default)
        except InvalidNameError as exc:
            problems.append(f"{dotted((*path, name), source)}: {exc}")
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(*problems)
    return TopicSettingsTable(default, topics)
