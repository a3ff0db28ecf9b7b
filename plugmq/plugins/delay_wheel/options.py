"""Options of the delay_wheel plugin (the keys of its ``[plugins.delay_wheel]`` table)."""

from __future__ import annotations

import resource
from typing import Any

import attrs

from plugmq.core import ConfigError, validate_topic
from plugmq.core.plugin_options import apply_renamed_options

__all__ = ["DEFAULT_MAX_DELAY_MS", "DEPRECATED_NAMES", "DelayWheelOptions", "open_hours_for"]


#: Two leap years: the issue asks for "at least 2 years" of arbitrary delay.
DEFAULT_MAX_DELAY_MS = 2 * 366 * 86_400_000

#: Old option name -> the family-wide name it was renamed to (still accepted, with a warning).
DEPRECATED_NAMES = {"clamp_over_max": "clamp_to_max_delay"}


def open_hours_for(option: int) -> int:
    """The open-hours cache size the option asks for (0: a quarter of the descriptor limit)."""
    if option:
        return option
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(8192, soft // 4 // 3))


def _topic(_inst: object, _attr: object, value: str) -> None:
    validate_topic(value)


def _optional_bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"plugins.delay_wheel.{attr.name} must be true or false, got {value!r}")


@attrs.frozen
class DelayWheelOptions:
    """How the wheel stores and dispatches (the delay family's common names: ``max_delay_ms``,
    ``clamp_to_max_delay``, ``fsync``, ``dispatch_batch``, ``dead_letter_*``, ``retry_after_error_ms``).

    ``max_delay_ms``: the longest accepted delay; beyond it a schedule is refused with
    DelayUnsupportedError, or clamped to it when ``clamp_to_max_delay`` is set
    (``clamp_over_max`` is the deprecated old name).
    ``fsync`` (default off, like every delay plugin and store_mmap's async flush): fsync every
    durable write (message append, cancel, the intent before each dispatch batch) so it survives
    power loss. Off, writes sit in the page cache: they survive ``kill -9`` of the broker but not
    a machine crash, and files are synced at close and when an hour is unmapped. A delayed message
    is then exactly as durable as a normal one on an async-flush store.
    ``dispatch_batch``: due messages written back per store batch (one checkpoint per batch).
    ``preload_seconds``: how far ahead of the wheel's tick the per-second index chains are walked
    and sorted into the millisecond level.
    ``dead_letter_older_than_ms``: messages overdue by more than this when the wheel starts go to
    ``dead_letter_topic`` (with REAL_TOPIC/REAL_QID) instead of their topic; 0 turns it off.
    ``open_hours_cache``: how many far (unmapped) hours keep their files open for appends (three
    descriptors each); 0 (default) sizes it to a quarter of the process's open-file limit, so a
    spread of delays over many hours does not reopen files on every schedule.
    ``retry_after_error_ms``: wait after a failed write-back before the wheel tries again.
    """

    max_delay_ms: int = attrs.field(default=DEFAULT_MAX_DELAY_MS, validator=attrs.validators.gt(0))
    clamp_to_max_delay: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    fsync: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    dispatch_batch: int = attrs.field(default=1000, validator=[attrs.validators.instance_of(int),
                                                               attrs.validators.ge(1)])
    preload_seconds: int = attrs.field(default=10, validator=attrs.validators.ge(0))
    dead_letter_older_than_ms: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    dead_letter_topic: str = attrs.field(default="%DLQ%DELAY", validator=_topic)
    open_hours_cache: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    retry_after_error_ms: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
    clamp_over_max: bool | None = attrs.field(default=None, validator=_optional_bool)

    def __attrs_post_init__(self) -> None:
        apply_renamed_options(self, "delay_wheel", DEPRECATED_NAMES)
