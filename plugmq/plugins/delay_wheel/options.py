"""Options of the delay_wheel plugin (the keys of its ``[plugins.delay_wheel]`` table)."""

from __future__ import annotations

import attrs

from plugmq.core import validate_topic

__all__ = ["DEFAULT_MAX_DELAY_MS", "DelayWheelOptions"]

#: Two leap years: the issue asks for "at least 2 years" of arbitrary delay.
DEFAULT_MAX_DELAY_MS = 2 * 366 * 86_400_000


def _topic(_inst: object, _attr: object, value: str) -> None:
    validate_topic(value)


@attrs.frozen
class DelayWheelOptions:
    """How the wheel stores and dispatches.

    ``max_delay_ms``: the longest accepted delay; beyond it a schedule is refused with
    DelayUnsupportedError, or clamped to it when ``clamp_over_max`` is set.
    ``fsync``: fsync every durable write (message append, cancel, dispatch checkpoint) so it
    survives power loss. Off, writes sit in the page cache: they survive ``kill -9`` of the broker
    but not a machine crash, and files are synced at close and when an hour is unmapped.
    ``preload_seconds``: how far ahead of the wheel's tick the per-second index chains are walked.
    ``dead_letter_older_than_ms``: messages found overdue at start-up by more than this go to
    ``dead_letter_topic`` (with REAL_TOPIC/REAL_QID set) instead of their topic; 0 turns it off.
    ``open_hours_cache``: how many far (unmapped) hours keep their files open for appends.
    ``retry_after_error_ms``: wait after a failed write-back before the wheel tries again.
    """

    max_delay_ms: int = attrs.field(default=DEFAULT_MAX_DELAY_MS, validator=attrs.validators.gt(0))
    clamp_over_max: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    fsync: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    preload_seconds: int = attrs.field(default=10, validator=attrs.validators.ge(0))
    dead_letter_older_than_ms: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    dead_letter_topic: str = attrs.field(default="%DLQ%DELAY", validator=_topic)
    open_hours_cache: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    retry_after_error_ms: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
