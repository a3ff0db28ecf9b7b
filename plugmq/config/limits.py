"""Rate limits: the ``[limits]`` table (messages/s and bytes/s per group, topic and account).

::

    [limits.groups.reports]       # what consumers of the group receive, all ways of consuming together
    messages_per_s = 100
    [limits.topics.Orders]        # what producers send to the topic
    bytes_per_s = 10_000_000
    [limits.accounts.alice]       # what an account (plugmq serve's ACL) sends, and separately receives
    messages_per_s = 500
    burst_s = 2                   # how much unused rate may be saved up (default: one second's worth)

A limit is a token bucket on the broker's clock. A send over its topic's or account's limit is
refused (RateLimitedError in Python, TOO_MANY_REQUESTS from plugmq serve) with the time after
which it would pass; a consumer over its group's or account's limit gets fewer messages, or none
and the same error once its wait is over. ``plugmq admin rate-limit`` changes limits of a running
broker (until it restarts: the config is where they are kept).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, InvalidNameError, ValidationError
from plugmq.core.names import validate_group, validate_topic
from plugmq.core.schema import setting, table_keys

__all__ = ["LIMIT_KEYS", "LIMIT_KINDS", "RateLimit", "RateLimits", "parse_limits_table", "rate_limit"]



def _positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValidationError(f"{attribute.name} must be a number > 0 (or absent: no limit), got {value!r}")


def _burst(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 60:
        raise ValidationError(f"{attribute.name} must be a number of seconds in (0, 60], got {value!r}")


@attrs.frozen
class RateLimit:
    """At most ``messages_per_s`` messages and ``bytes_per_s`` body bytes a second (None: no limit
    of that kind); up to ``burst_s`` seconds' worth of unused rate is saved up."""

    messages_per_s: float | None = setting(None, doc="messages a second (left out: no message limit)",
                                           expected="a number > 0", validator=_positive_or_none)
    bytes_per_s: float | None = setting(None, doc="body bytes a second (left out: no byte limit)",
                                        expected="a number > 0", validator=_positive_or_none)
    burst_s: float = setting(1.0, doc="seconds' worth of unused rate saved up (a bucket starts full)",
                             expected="a number of seconds in (0, 60]", validator=_burst)

    def __attrs_post_init__(self) -> None:
        if self.messages_per_s is None and self.bytes_per_s is None:
            raise ValidationError("a rate limit needs messages_per_s, bytes_per_s or both")


@attrs.frozen
class RateLimits:
    """The configured limits by kind (``groups``, ``topics``, ``accounts``) and name."""

    groups: Mapping[str, RateLimit] = setting(
        factory=dict, doc="[limits.groups.<group>]: what the group's consumers receive, every way of consuming "
                          "together (pop, pull, push)")
    topics: Mapping[str, RateLimit] = setting(factory=dict, doc="[limits.topics.<topic>]: what producers send to it")
    accounts: Mapping[str, RateLimit] = setting(
        factory=dict, doc="[limits.accounts.<account>]: what a plugmq serve ACL account sends, and separately "
                          "receives")

    def of(self, kind: str) -> Mapping[str, RateLimit]:
        return {"groups": self.groups, "topics": self.topics, "accounts": self.accounts}[kind]


LIMIT_KEYS = tuple(table_keys(RateLimit))
LIMIT_KINDS = tuple(table_keys(RateLimits))


def check_limit_name(kind: str, name: str) -> str:
    """``name`` if it is a legal name for a limit of ``kind``; ValidationError (InvalidNameError) if not."""
    if kind not in LIMIT_KINDS:
        raise ValidationError(f"a rate limit is on one of {', '.join(LIMIT_KINDS)}, not {kind!r}")
    if kind == "groups":
        return validate_group(name)
    if kind == "topics":
        return validate_topic(name)
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise InvalidNameError(f"account name {name!r} must be a non-empty string without spaces")
    return name


def rate_limit(table: Mapping[str, Any], *, path: str = "limit") -> RateLimit:
    """A RateLimit from its table; ConfigError naming ``path`` and the key for a bad one."""
    for key in table:
        if key not in LIMIT_KEYS:
            close = difflib.get_close_matches(key, LIMIT_KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}.{key}: unknown key.{hint} Known keys: {', '.join(LIMIT_KEYS)}")
    try:
        return RateLimit(**table)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_limits_table(table: Any, *, path: str = "limits") -> RateLimits:
    """Validate a ``[limits]`` table of ``groups``, ``topics`` and ``accounts`` sub-tables."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path} must be a table, got {table!r}")
    found: dict[str, dict[str, RateLimit]] = {}
    for kind, entries in table.items():
        if kind not in LIMIT_KINDS:
            raise ConfigError(f"{path}.{kind}: unknown table; [limits] has {', '.join(LIMIT_KINDS)} "
                              f"(e.g. [limits.groups.<group>])")
        if not isinstance(entries, Mapping):
            raise ConfigError(f"{path}.{kind} must be a table of [{path}.{kind}.<name>] tables, got {entries!r}")
        found[kind] = {}
        for name, entry in entries.items():
            where = f"{path}.{kind}.{name}"
            try:
                check_limit_name(kind, name)
            except ValidationError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where} must be a table such as {{ messages_per_s = 100 }}, got {entry!r}")
            found[kind][name] = rate_limit(entry, path=where)
    return RateLimits(**found)
