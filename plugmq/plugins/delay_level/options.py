"""Options of the delay_level plugin (the keys of its ``[plugins.delay_level]`` table)."""

from __future__ import annotations

from typing import Any

import attrs

from plugmq.core import ConfigError
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from plugmq.core.plugin_options import apply_renamed_options
from plugmq.kit.options import topic_name
from plugmq.plugins.delay_level.offsets import MAX_QUEUES

__all__ = ["DEFAULT_DEAD_LETTER_TOPIC", "DEPRECATED_NAMES", "DelayLevelOptions"]


DEFAULT_DEAD_LETTER_TOPIC = "%DLQ%DELAY_LEVEL"

#: Old option name -> the family-wide name it was renamed to (still accepted, with a warning).
#: The two old durability switches were only meaningful together; either one now turns ``fsync`` on.
DEPRECATED_NAMES = {
    "clamp_over_max": "clamp_to_max_delay",
    "fsync_offsets": "fsync",
    "flush_store_before_persist": "fsync",
}


def _levels(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"plugins.delay_level.levels must be a string like {DEFAULT_DELAY_LEVELS!r}, got {value!r}")
    if len(parse_delay_levels(value)) > MAX_QUEUES:
        raise ConfigError(f"plugins.delay_level.levels lists more than {MAX_QUEUES} levels; that many cannot be kept")


def _bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"plugins.delay_level.{attr.name} must be true or false, got {value!r}")


def _optional_bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _bool(_inst, attr, value)


def _int_at_least(low: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"plugins.delay_level.{attr.name} must be an integer >= {low}, got {value!r}")

    return check


@attrs.frozen
class DelayLevelOptions:
    """RocketMQ 4.x fixed delay levels (the delay family's common names: ``clamp_to_max_delay``,
    ``fsync``, ``dispatch_batch``, ``dead_letter_*``, ``retry_after_error_ms``; the maximum delay
    is the last level, so there is no ``max_delay_ms``).

    ``levels``: RocketMQ's ``messageDelayLevel`` list; level n is the n-th entry.
    ``clamp_to_max_delay``: a level above the last is served as the last level (RocketMQ's rule);
    off, such a request is refused with DelayUnsupportedError (``clamp_over_max`` is the
    deprecated old name).
    ``tick_ms``: a level's timer fires at its head's deliver time rounded up to a multiple of
    this, so several deliveries share one wake-up; it is the declared resolution (1 = exact).
    ``dispatch_batch``: at most this many deliveries per store batch; the level's offset is
    persisted after each batch, so after a ``kill -9`` at most one batch per level is in doubt
    (and ``was_delivered`` settles it when the scheduler opens).
    ``fsync`` (default off, like every delay plugin and store_mmap's async flush): power-cut
    safety. A persisted offset must never be durable *ahead of* the write-backs it covers (that
    would skip messages), while one that is behind is settled by ``was_delivered``. So ``fsync``
    flushes the store, then fsyncs the offsets, after every batch (``fsync_offsets`` and
    ``flush_store_before_persist`` are the deprecated old switches, which only made sense
    together). Off, a ``kill -9`` still loses and repeats nothing: the page cache survives it.
    ``close()`` always flushes and syncs.
    ``dead_letter_older_than_ms``: messages found overdue by more than this when the scheduler
    starts go to ``dead_letter_topic`` (queue 0, REAL_TOPIC / REAL_QID naming where they were
    going) instead of their topic; 0 turns it off.
    ``retry_after_error_ms``: after a failed write-back the level tries again this much later.
    """

    levels: str = attrs.field(default=DEFAULT_DELAY_LEVELS, validator=_levels)
    clamp_to_max_delay: bool = attrs.field(default=True, validator=_bool)
    tick_ms: int = attrs.field(default=1, validator=_int_at_least(1))
    dispatch_batch: int = attrs.field(default=1000, validator=_int_at_least(1))
    fsync: bool = attrs.field(default=False, validator=_bool)
    dead_letter_older_than_ms: int = attrs.field(default=0, validator=_int_at_least(0))
    dead_letter_topic: str = attrs.field(default=DEFAULT_DEAD_LETTER_TOPIC, validator=topic_name("delay_level"))
    retry_after_error_ms: int = attrs.field(default=1000, validator=_int_at_least(1))
    clamp_over_max: bool | None = attrs.field(default=None, validator=_optional_bool)
    fsync_offsets: bool | None = attrs.field(default=None, validator=_optional_bool)
    flush_store_before_persist: bool | None = attrs.field(default=None, validator=_optional_bool)

    def __attrs_post_init__(self) -> None:
        # either old durability switch on means durable
        apply_renamed_options(self, "delay_level", DEPRECATED_NAMES,
                              combine={"fsync": lambda old, new: old or new})

    @property
    def levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.levels)
