"""Options of the ``delay_schedule`` plugin (the ``[plugins.delay_schedule]`` table)."""

from __future__ import annotations

import resource
from typing import Any

import attrs

from plugmq.core import ConfigError, validate_topic
from plugmq.core.plugin_options import apply_renamed_options

__all__ = ["DEFAULT_DEAD_LETTER_TOPIC", "DEPRECATED_NAMES", "TWO_YEARS_MS", "DelayScheduleOptions"]


#: Old option name -> the family-wide name it was renamed to (still accepted, with a warning).
DEPRECATED_NAMES = {"retry_delay_ms": "retry_after_error_ms"}

#: QMQ's design limit ("最大支持两年", seed 001): about two years of schedule segments.
TWO_YEARS_MS = 2 * 365 * 86_400_000
DEFAULT_DEAD_LETTER_TOPIC = "%DLQ%DELAY_SCHEDULE"


def _int_between(low: int, high: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"plugins.delay_schedule.{attr.name} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(
                f"plugins.delay_schedule.{attr.name} = {value} is outside {low}..{high}; pick a value in that range"
            )

    return check


def _bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"plugins.delay_schedule.{attr.name} must be true or false, got {value!r}")


def _power_of_two(_inst: object, attr: attrs.Attribute[Any], value: int) -> None:
    if value & (value - 1):
        raise ConfigError(
            f"plugins.delay_schedule.{attr.name} = {value} must be a power of two (the wheel masks tick numbers)"
        )


def _optional_int(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _int_between(1, 3_600_000)(_inst, attr, value)


def _topic(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    try:
        validate_topic(value)
    except Exception as exc:
        raise ConfigError(f"plugins.delay_schedule.{attr.name}: {exc}") from exc


@attrs.frozen
class DelayScheduleOptions:
    """QMQ-style delay server options (the delay family's common names: ``max_delay_ms``,
    ``clamp_to_max_delay``, ``fsync``, ``dispatch_batch``, ``dead_letter_*``, ``retry_after_error_ms``).

    ``bucket_minutes``: deliver-time span of one schedule-log segment (QMQ ships 60; the seed
    describes 1). Changing it on a data dir that holds segments is refused at open.
    ``tick_ms``: the hashed wheel's tick, i.e. the resolution (QMQ: 500 ms; here 1 ms: a message
    is delivered at its deliver time); a message is delivered at the first tick boundary at or
    after its deliver time.
    ``load_ahead_ms``: a segment's messages enter the wheel this long before its bucket starts.
    ``max_delay_ms``: longest accepted delay (QMQ's design limit is two years); longer ones are
    refused, or clamped when ``clamp_to_max_delay``.
    ``fsync`` (default off, like every delay plugin and store_mmap's async flush): fsync the
    message log on every ``schedule()`` (~1 ms each), schedule segments before the iterator
    checkpoint moves, and the dispatch log's intents before every delivery batch. Off,
    everything stays in the page cache: a ``kill -9`` loses nothing, a power cut may — exactly
    what an async-flush store promises for a normal message. Turn it on together with the
    store's sync flush.
    ``dispatch_batch``: due messages written back per store batch (one intent/delivered mark
    pair in the dispatch log per batch).
    ``dead_letter_older_than_ms``: messages overdue by more than this when the scheduler starts go
    to ``dead_letter_topic`` (real topic/queue kept in REAL_TOPIC / REAL_QID) instead of their
    topic; 0 turns it off.
    ``open_files``: schedule segments and dispatch logs kept open (0, the default: a quarter of
    the process's open-file limit, so delays spread over many buckets do not reopen files per
    record; at least 4).
    ``retry_after_error_ms``: wait after a failed write-back before trying again
    (``retry_delay_ms`` is the deprecated old name).
    """

    bucket_minutes: int = attrs.field(default=60, validator=_int_between(1, 60))
    tick_ms: int = attrs.field(default=1, validator=_int_between(1, 60_000))
    load_ahead_ms: int = attrs.field(default=60_000, validator=_int_between(0, 86_400_000))
    wheel_slots: int = attrs.field(default=4096, validator=[_int_between(16, 1 << 20), _power_of_two])
    max_delay_ms: int = attrs.field(default=TWO_YEARS_MS, validator=_int_between(1, 100 * 365 * 86_400_000))
    clamp_to_max_delay: bool = attrs.field(default=False, validator=_bool)
    message_log_segment_bytes: int = attrs.field(default=64 << 20, validator=_int_between(64 << 10, 1 << 30))
    fsync: bool = attrs.field(default=False, validator=_bool)
    iterate_batch: int = attrs.field(default=10_000, validator=_int_between(1, 10_000_000))
    dispatch_batch: int = attrs.field(default=1_000, validator=_int_between(1, 1_000_000))
    retry_after_error_ms: int = attrs.field(default=1_000, validator=_int_between(1, 3_600_000))
    dead_letter_older_than_ms: int = attrs.field(default=0, validator=_int_between(0, 100 * 365 * 86_400_000))
    dead_letter_topic: str = attrs.field(default=DEFAULT_DEAD_LETTER_TOPIC, validator=_topic)
    open_files: int = attrs.field(default=0, validator=_int_between(0, 65536))
    retry_delay_ms: int | None = attrs.field(default=None, validator=_optional_int)

    def __attrs_post_init__(self) -> None:
        apply_renamed_options(self, "delay_schedule", DEPRECATED_NAMES)

    @property
    def open_files_limit(self) -> int:
        if self.open_files:
            return max(4, self.open_files)
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(64, min(16384, soft // 4))

    @property
    def bucket_ms(self) -> int:
        return self.bucket_minutes * 60_000
