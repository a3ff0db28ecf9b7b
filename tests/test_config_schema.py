"""The configuration engine: every table gets the same errors, and all of a file's errors at once."""

from __future__ import annotations

import math
from typing import Annotated, Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugmq.config.broker import BrokerConfig, ClusterTable, load_config
from plugmq.config.policy import GroupTable
from plugmq.core.errors import ConfigError
from plugmq.core.plugin_options import value_fits
from plugmq.core.schema import Expect, Refusal, at_least, setting, structure, table_keys

WRONG_VALUES: tuple[Any, ...] = ("text", 1.5, [1], {"a": 1}, True, -7)
#: (where the table sits in a config mapping, its schema)
TABLES: tuple[tuple[tuple[str, ...], type], ...] = (
    (("broker",), BrokerConfig), (("cluster",), ClusterTable), (("groups",), GroupTable), (("groups", "g"), GroupTable))
for _where, _schema in TABLES:
    attrs.resolve_types(_schema)  # the annotations as types, for value_fits


def _mapping(where: tuple[str, ...], table: dict[str, Any]) -> dict[str, Any]:
    for key in reversed(where):
        table = {key: table}
    return table


def _wrong_values(field: attrs.Attribute[Any]) -> list[Any]:
    return [v for v in WRONG_VALUES if not value_fits(v, field.type) and field.converter is None]


def _problems(mapping: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        load_config(mapping)
    return caught.value.problems


@pytest.mark.parametrize(("where", "schema"), TABLES)
def test_a_value_of_the_wrong_type_is_one_line_naming_its_full_path(where: tuple[str, ...], schema: type) -> None:
    checked = 0
    for key, field in table_keys(schema).items():
        base = {"name": "c"} if schema is ClusterTable and key != "name" else {}
        for wrong in _wrong_values(field):
            if where == ("groups",) and isinstance(wrong, dict):
                continue  # [groups.<key>] is a group of that name (test_a_group_may_be_named_like_a_policy_key)
            lines = _problems(_mapping(where, {**base, key: wrong}))
            path = ".".join((*where, key))
            assert len(lines) == 1 and lines[0].startswith(f"<mapping>: {path}"), lines  # broker.plugins[0] too
            assert " must be " in lines[0] and ", got " in lines[0], lines
            checked += 1
    assert checked >= len(table_keys(schema))


def test_a_group_may_be_named_like_a_policy_key() -> None:
    config = load_config({"groups": {"fifo": {"fifo": True}, "max_delivery_attempts": 5,
                                     "backoff_s": {"max_delivery_attempts": 2}}})
    groups = config.groups
    assert groups.default.redelivery.max_attempts == 5
    assert groups.groups["fifo"].fifo and groups.groups["fifo"].redelivery.max_attempts == 5
    assert groups.groups["backoff_s"].redelivery.max_attempts == 2
    (line,) = _problems({"groups": {"fifo": {"a": 1}}})
    assert line.startswith("<mapping>: groups.fifo.a: unknown key."), line


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([(where, key) for where, schema in TABLES for key in table_keys(schema)
                                 if _wrong_values(table_keys(schema)[key])]), min_size=1, max_size=6, unique=True))
def test_every_bad_key_of_a_file_is_reported_at_once(bad: list[tuple[tuple[str, ...], str]]) -> None:
    mapping: dict[str, Any] = {"cluster": {"name": "c"}}
    for where, key in bad:
        node = mapping
        for part in where:
            node = node.setdefault(part, {})
        schema = dict(TABLES)[where]
        node[key] = _wrong_values(table_keys(schema)[key])[0]
    text = "\n".join(_problems(mapping))
    for where, key in bad:
        assert f"<mapping>: {'.'.join((*where, key))} " in text, (where, key, text)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(table_keys(BrokerConfig))), st.data())
def test_a_misspelt_key_names_the_closest_known_one(key: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=1, max_value=len(key) - 1))
    typo = key[:cut] + key[cut + 1:]
    if typo in table_keys(BrokerConfig):
        return
    (line,) = _problems({"broker": {typo: 1}})
    assert line.startswith(f"<mapping>: broker.{typo}: unknown key."), line
    assert "Did you mean" in line and "Known keys: " in line


@attrs.frozen
class _Table:
    count: int = setting(1, doc="a count", validator=at_least(1))
    ratio: Annotated[float, Expect("a finite number", math.isfinite)] = setting(0.5, doc="a ratio")
    names: tuple[str, ...] = setting((), doc="names")
    limit: int = setting(10, doc="at most this many")

    def __attrs_post_init__(self) -> None:
        if self.count > self.limit:
            raise Refusal(f"must be <= limit ({self.limit}), got {self.count}", key="count")


def _lines(data: Any, source: str = "", path: tuple[str, ...] = ()) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        structure(data, _Table, source, path)
    return caught.value.problems


def test_types_are_strict_as_a_toml_file_writes_them() -> None:
    assert structure({"names": ["a"], "ratio": 1}, _Table) == _Table(names=("a",), ratio=1.0)
    assert _lines({"count": "5", "ratio": True, "names": "ab"}, "f", ("t",)) == (
        "f: t.count must be an integer, got '5'", "f: t.ratio must be a finite number, got True",
        "f: t.names must be a list, each item a string, got 'ab'")
    assert _lines({"ratio": math.inf}) == ("ratio must be a finite number, got inf",)


def test_validators_one_key_at_a_time_and_rules_between_keys_name_their_key() -> None:
    assert _lines({"count": 0, "names": [1]}, "f", ("t",)) == (
        "f: t.count must be >= 1, got 0", "f: t.names[0] must be a string, got 1")
    assert _lines({"count": 12, "limit": 11}, "f", ("t",)) == ("f: t.count must be <= limit (11), got 12",)
