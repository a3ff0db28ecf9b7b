"""Consumer-group policies: when a failed message is delivered again, and when it is dead-lettered.

One :class:`RedeliveryPolicy` decides for every way of consuming: push consumers' send-back through
``%RETRY%<group>``, orderly consumers' in-place retries, pop consumption (simple consumers and the
gRPC server) when an invisible time runs out or a consumer gives up on a message. Attempts count
deliveries: the first delivery is attempt 1, so RocketMQ's ``maxReconsumeTimes`` = 16 is
``max_attempts`` = 17.

:class:`GroupPolicy` adds what else a group decides (FIFO pop consumption); :class:`GroupPolicies`
holds the broker's defaults and the groups configured in ``[groups]``::

    [groups]                    # every group's defaults
    max_delivery_attempts = 17
    backoff_s = [10, 30, 60]    # before attempt 2, 3, 4 and (the last one repeats) every later one

    [groups.orders]             # one group (keys it leaves out: the defaults above)
    fifo = true
    max_delivery_attempts = 5
    dead_letter_topic = "%DLQ%{group}"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import attrs

from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.errors import ConfigError, InvalidNameError, ValidationError
from plugmq.core.names import validate_group, validate_topic
from plugmq.core.schema import Expect, Mismatch, at_least, dotted, non_empty, setting, structure, table_keys

__all__ = [
    "DEFAULT_BACKOFF_S",
    "GROUP_POLICY_KEYS",
    "GroupPolicies",
    "GroupPolicy",
    "GroupTable",
    "RedeliveryPolicy",
    "parse_groups_table",
    "split_groups_table",
]

#: RocketMQ's retry back-off: delay levels 3..18 (10 s, 30 s, 1 min, 2 min, ... 1 h, 2 h).
DEFAULT_BACKOFF_S: tuple[float, ...] = tuple(ms / 1000 for ms in DEFAULT_DELAY_LEVELS_MS[2:])


def _check_attempts(_inst: object, _attr: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"max_attempts must be a whole number >= 1 (1 = no redelivery), got {value!r}")


def _to_backoff(value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValidationError(f"backoff_s must be a list of seconds such as [1, 5, 30], got {value!r}")
    items = tuple(value)
    if not items:
        raise ValidationError("backoff_s is empty; give at least one back-off in seconds, e.g. [10]")
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not item > 0:
            raise ValidationError(f"backoff_s[{i}] must be a number of seconds > 0, got {item!r}")
    return tuple(float(item) for item in items)


def _check_dead_letter_topic(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str):
        raise ValidationError(f"dead_letter_topic must be a string such as '%DLQ%{{group}}', got {value!r}")
    try:
        validate_topic(value.replace("{group}", "g"))
    except InvalidNameError as exc:
        raise ValidationError(f"dead_letter_topic {value!r} does not name a legal topic ({exc}); "
                              "use letters, digits, % | _ - and the placeholder {group}") from None


@attrs.frozen
class RedeliveryPolicy:
    """How often and how soon a message a consumer failed on is delivered again, and where it goes last.

    ``max_attempts``: deliveries before the dead-letter queue (17 = RocketMQ's 16 reconsumes).
    ``backoff_s``: the wait before the next attempt after attempt n failed is ``backoff_s[n - 1]``;
    attempts beyond the list use its last entry. ``dead_letter_topic``: the DLQ topic, ``{group}``
    standing for the group's name (RocketMQ's ``%DLQ%<group>`` by default).
    """

    max_attempts: int = attrs.field(default=17, validator=_check_attempts)
    backoff_s: tuple[float, ...] = attrs.field(default=DEFAULT_BACKOFF_S, converter=_to_backoff)
    dead_letter_topic: str = attrs.field(default="%DLQ%{group}", validator=_check_dead_letter_topic)

    @property
    def max_reconsume_times(self) -> int:
        """RocketMQ's name for the same limit: redeliveries after the first delivery."""
        return self.max_attempts - 1

    def with_max_reconsume_times(self, times: int) -> RedeliveryPolicy:
        """This policy with RocketMQ's ``maxReconsumeTimes`` (0: a failure goes straight to the DLQ)."""
        if isinstance(times, bool) or not isinstance(times, int) or times < 0:
            raise ValidationError(f"max_reconsume_times must be a whole number >= 0, got {times!r}")
        return attrs.evolve(self, max_attempts=times + 1)

    def exhausted(self, failed_attempt: int) -> bool:
        """Whether a message whose delivery ``failed_attempt`` failed goes to the DLQ instead of again."""
        return failed_attempt >= self.max_attempts

    def backoff_ms(self, failed_attempt: int) -> int:
        """How long after delivery ``failed_attempt`` failed the next attempt may come, in ms."""
        index = min(max(failed_attempt, 1), len(self.backoff_s)) - 1
        return round(self.backoff_s[index] * 1000)

    def dead_letter_topic_for(self, group: str) -> str:
        """The DLQ topic of ``group`` under this policy."""
        return validate_topic(self.dead_letter_topic.replace("{group}", validate_group(group)))


def _params(table: Mapping[str, Any]) -> dict[str, Any]:
    """A copy, so a caller's later change to its table never reaches the policy."""
    return dict(table)


@attrs.frozen
class GroupPolicy:
    """What a consumer group decides: its redelivery policy, and whether pop consumption is FIFO.

    ``fifo``: a queue hands the group nothing new while a message of it is in flight, and one
    receive never carries two messages of one message group (RocketMQ 5's FIFO groups).
    """

    redelivery: RedeliveryPolicy = attrs.field(factory=RedeliveryPolicy)
    fifo: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    # plugmq serve: push consumers of the group get this strategy's share of the cluster-wide,
    # RocketMQ-sorted queue list (None: RocketMQ 5's pop assignment, every broker to everyone).
    allocation: str | None = None
    allocation_params: Mapping[str, Any] = attrs.field(factory=dict, converter=_params)


@attrs.frozen
class GroupPolicies:
    """Every group's policy: ``groups`` by name, ``default`` for the rest."""

    default: GroupPolicy = attrs.field(factory=GroupPolicy)
    groups: Mapping[str, GroupPolicy] = attrs.field(factory=dict)

    def policy(self, group: str) -> GroupPolicy:
        return self.groups.get(group, self.default)


# ------------------------------------------------------------------------------ the [groups] table
_SECONDS = Annotated[float, Expect("a number of seconds > 0", lambda v: v > 0)]
_STRATEGY_WORDS = 'an allocation strategy name such as "AVG" or "MACHINE_ROOM_NEARBY"'


def _strategy_name(_inst: object, _attr: object, value: str | None) -> None:
    if value == "":
        raise Mismatch(_STRATEGY_WORDS, value)


def _dead_letter_topic(_inst: object, _attr: object, value: str | None) -> None:
    if value is not None:
        _check_dead_letter_topic(None, None, value)


@attrs.frozen
class GroupTable:
    """The keys of ``[groups]`` (every group's defaults) and of each ``[groups.<group>]`` table.

    A key left out keeps the default (the broker's, or for a group, ``[groups]``'s).
    """

    max_delivery_attempts: int | None = setting(
        None, doc="deliveries before the dead-letter queue (1 = no redelivery; 17 = RocketMQ's 16 reconsumes)",
        validator=attrs.validators.optional(at_least(1, " (1 = no redelivery)")))
    backoff_s: tuple[_SECONDS, ...] | None = setting(
        None, doc="seconds before attempt 2, 3, ... after a failure; the last one repeats (default: delay levels 3-18)",
        expected="a list of seconds, e.g. [1, 5, 30]",
        validator=attrs.validators.optional(non_empty("give at least one back-off in seconds, e.g. [10]")))
    dead_letter_topic: str | None = setting(
        None, doc="the dead-letter topic; {group} stands for the group's name (default %DLQ%{group})",
        validator=_dead_letter_topic)
    fifo: bool | None = setting(
        None, doc="FIFO pop consumption: nothing new from a queue while a message of it is in flight (default false)")
    allocation: str | None = setting(
        None, doc="plugmq serve: push consumers get this strategy's share of the cluster's queues "
                  "(default: RocketMQ 5's pop assignment)", expected=_STRATEGY_WORDS, validator=_strategy_name)
    allocation_params: Mapping[str, Any] | None = setting(
        None, doc="the allocation strategy's parameters", expected='a table of the strategy\'s parameters, e.g. '
                                                                  '{ rooms = ["east"] }')

    def over(self, base: GroupPolicy) -> GroupPolicy:
        """``base`` with the keys this table sets."""
        redelivery: dict[str, Any] = {name: value for name, value in (("max_attempts", self.max_delivery_attempts),
                                                      ("backoff_s", self.backoff_s),
                                                      ("dead_letter_topic", self.dead_letter_topic))
                      if value is not None}
        return GroupPolicy(
            attrs.evolve(base.redelivery, **redelivery), base.fifo if self.fifo is None else self.fifo,
            base.allocation if self.allocation is None else self.allocation,
            base.allocation_params if self.allocation_params is None else self.allocation_params)


#: The keys of a group table; ``[groups]`` takes them as every group's defaults.
GROUP_POLICY_KEYS = tuple(table_keys(GroupTable))


def split_groups_table(table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``[groups]`` as (every group's defaults, the groups' own tables by name).

    A table is a group's, named by its key, unless the key is one whose value is a table
    (``allocation_params``): a group may be called ``fifo`` or ``backoff_s`` like any other.
    """
    defaults = {k: v for k, v in table.items()
                if not isinstance(v, (Mapping, GroupPolicy)) or k in _TABLE_VALUED_KEYS}
    return defaults, {k: v for k, v in table.items() if k not in defaults}


#: Keys of a group table whose value is itself a table (so ``[groups] allocation_params = {...}``
#: is every group's default, not a group of that name).
_TABLE_VALUED_KEYS = frozenset({"allocation_params"})


def parse_groups_table(table: Any, *, source: str = "", path: tuple[str, ...] = ("groups",),
                       base: GroupPolicies | None = None) -> GroupPolicies:
    """Validate a ``[groups]`` table: scalar keys are every group's defaults, sub-tables are groups.

    A sub-table may also be a :class:`GroupPolicy` (Python callers). ``base`` supplies defaults and
    groups configured elsewhere (the table's own entries win). A ConfigError lists every problem,
    each naming its key path and the fix.
    """
    if not isinstance(table, Mapping):
        raise ConfigError(f"{dotted(path, source)} must be a table, got {table!r}")
    base = base or GroupPolicies()
    problems: list[str] = []
    defaults_table, group_tables = split_groups_table(table)
    default = base.default
    try:
        default = structure(defaults_table, GroupTable, source, path).over(base.default)
    except ConfigError as exc:
        problems.extend(exc.problems)
    groups = dict(base.groups)
    for name, entry in group_tables.items():
        try:
            validate_group(name)
            groups[name] = entry if isinstance(entry, GroupPolicy) else \
                structure(entry, GroupTable, source, (*path, name)).over(default)
        except InvalidNameError as exc:
            problems.append(f"{dotted((*path, name), source)}: {exc}")
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(*problems)
    return GroupPolicies(default, groups)
