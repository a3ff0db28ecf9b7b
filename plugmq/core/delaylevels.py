"""RocketMQ's delay levels, shared by the broker (retry back-off) and level-based strategies."""

from __future__ import annotations

from plugmq.core.errors import ConfigError

__all__ = ["DEFAULT_DELAY_LEVELS", "DEFAULT_DELAY_LEVELS_MS", "parse_delay_levels"]

#: RocketMQ's messageDelayLevel default: level n is the n-th entry (1-based).
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Parse a level list like ``"1s 5s 10s 1m 2h"`` into milliseconds per level."""
    levels = []
    for item in text.split():
        unit = item[-1:].lower()
        number = item[:-1]
        if unit not in _UNITS_MS or not number.isdigit() or int(number) <= 0:
            raise ConfigError(
                f"delay level {item!r} in {text!r} is not a positive number followed by s, m, h or d"
            )
        levels.append(int(number) * _UNITS_MS[unit])
    if not levels:
        raise ConfigError("the delay level list is empty; give at least one level such as '1s'")
    return tuple(levels)


DEFAULT_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)
