"""Options of the ``txn`` plugin (the ``[plugins.txn]`` table)."""

from __future__ import annotations

from typing import Any

import attrs

from plugmq.core import ConfigError

__all__ = ["TxnOptions"]


def _number_between(low: float, high: float, *, integer: bool = False) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            what = "an integer" if integer else "a number"
            raise ConfigError(f"plugins.txn.{attr.name} must be {what}, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(f"plugins.txn.{attr.name} = {value} is outside {low}..{high}; pick a value in that range")

    return check


def _bool(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"plugins.txn.{attr.name} must be true or false, got {value!r}")


@attrs.frozen
class TxnOptions:
    """Check-back schedule and op-log durability.

    ``transaction_timeout_s``: a half message without a decision is first checked this long after
    it was stored (RocketMQ's transactionTimeout, 6 s); a message's check-immunity time replaces
    it for that message. ``check_interval_s``: then once per interval (transactionCheckInterval;
    30 s here as in the issue). ``check_max``: at most this many checks; at the next due time
    after the last one the message moves to the discard topic (transactionCheckMax, 15).
    ``fsync``: fsync the op log before a decision takes effect and before the checks of a batch
    are made. False leaves it in the page cache: a ``kill -9`` loses nothing, a power cut may.
    ``check_batch``: due messages counted with one op-log write (and one fsync) per batch.
    ``compact_bytes``: the op log is rewritten (only what is still open) once it grows past this.
    """

    transaction_timeout_s: float = attrs.field(default=6.0, validator=_number_between(0, 86_400 * 365))
    check_interval_s: float = attrs.field(default=30.0, validator=_number_between(0.001, 86_400 * 365))
    check_max: int = attrs.field(default=15, validator=_number_between(0, 1_000_000, integer=True))
    fsync: bool = attrs.field(default=True, validator=_bool)
    check_batch: int = attrs.field(default=1_000, validator=_number_between(1, 10_000_000, integer=True))
    compact_bytes: int = attrs.field(default=16 << 20, validator=_number_between(4096, 1 << 40, integer=True))

    @property
    def timeout_ms(self) -> int:
        return round(self.transaction_timeout_s * 1000)

    @property
    def interval_ms(self) -> int:
        return round(self.check_interval_s * 1000)
