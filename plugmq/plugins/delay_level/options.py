"""Options of the delay_level plugin (the keys of its ``[plugins.delay_level]`` table)."""

from __future__ import annotations

from typing import Any

import attrs

from plugmq.core import (
    DEFAULT_DELAY_LEVELS,
    ConfigError,
    parse_delay_levels,
    validate_topic,
)
from plugmq.plugins.delay_level.offsets import MAX_QUEUES

__all__ = ["DEFAULT_DEAD_LETTER_TOPIC", "DelayLevelOptions"]

DEFAULT_DEAD_LETTER_TOPIC = "%DLQ%DELAY_LEVEL"


def _levels(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"plugins.delay_level.levels must be a string like {DEFAULT_DELAY_LEVELS!r}, got {value!r}")
    if len(parse_delay_levels(value)) > MAX_QUEUES:
        raise ConfigError(f"plugins.delay_level.levels lists more than {MAX_QUEUES} levels; that many cannot be kept")


def _bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"plugins.delay_level.{attr.name} must be true or false, got {value!r}")


def _int_at_least(low: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"plugins.delay_level.{attr.name} must be an integer >= {low}, got {value!r}")

    return check


def _topic(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    try:
        validate_topic(value)
    except Exception as exc:
        raise ConfigError(f"plugins.delay_level.{attr.name}: {exc}") from exc


@attrs.frozen
class DelayLevelOptions:
    """RocketMQ 4.x fixed delay levels.

    ``levels``: RocketMQ's ``messageDelayLevel`` list; level n is the n-th entry.
    ``clamp_over_max``: a level above the last is served as the last level (RocketMQ's rule);
    off, such a request is refused with DelayUnsupportedError.
    ``tick_ms``: a level's timer fires at its head's deliver time rounded up to a multiple of
    this, so several deliveries share one wake-up; it is the declared resolution (1 = exact).
    ``dispatch_batch``: at most this many deliveries per level per wake-up; the level's offset
    is persisted after each batch, so after a ``kill -9`` at most one batch per level is in doubt
    (and ``was_delivered`` settles it at start-up).
    ``fsync_offsets`` / ``flush_store_before_persist``: power-cut safety. A persisted offset must
    never be durable *ahead of* the write-backs it covers (that would skip messages), while one
    that is behind is settled by ``was_delivered`` at start-up. So for power-cut safety turn both
    on (the store is flushed, then the offsets are fsynced, every batch); fsyncing offsets alone
    buys nothing with an async-flush store. Both off (default), a ``kill -9`` still loses and
    repeats nothing: the page cache survives it. ``close()`` always flushes and syncs.
    ``dead_letter_older_than_ms``: messages found at ``start()`` overdue by more than this go to
    ``dead_letter_topic`` (queue 0, REAL_TOPIC / REAL_QID naming where they were going) instead
    of their topic; 0 turns it off.
    ``retry_after_error_ms``: after a failed write-back the level tries again this much later.
    """

    levels: str = attrs.field(default=DEFAULT_DELAY_LEVELS, validator=_levels)
    clamp_over_max: bool = attrs.field(default=True, validator=_bool)
    tick_ms: int = attrs.field(default=1, validator=_int_at_least(1))
    dispatch_batch: int = attrs.field(default=256, validator=_int_at_least(1))
    fsync_offsets: bool = attrs.field(default=False, validator=_bool)
    flush_store_before_persist: bool = attrs.field(default=False, validator=_bool)
    dead_letter_older_than_ms: int = attrs.field(default=0, validator=_int_at_least(0))
    dead_letter_topic: str = attrs.field(default=DEFAULT_DEAD_LETTER_TOPIC, validator=_topic)
    retry_after_error_ms: int = attrs.field(default=1000, validator=_int_at_least(1))

    @property
    def levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.levels)
