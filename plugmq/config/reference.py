"""The reference of every configuration key, generated from the schemas (``plugmq check-config --reference``).

Each table is an attrs class checked by :mod:`plugmq.core.schema`; its fields are the keys, their
annotations the types, their defaults the defaults and ``metadata["doc"]`` the meaning. Sub-tables
(a field whose type is an attrs class, or a table of them) get a section of their own.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import PurePath
from typing import Any

import attrs

from plugmq.config.broker import BrokerConfig, ClusterTable, ConfigFile, OldBrokerKeys, OldServerKeys
from plugmq.config.limits import RateLimits
from plugmq.config.policy import GroupTable
from plugmq.config.topics import TopicTable
from plugmq.core.schema import describe_type, table_keys

__all__ = ["CONFIG_TABLES", "reference"]

#: The tables of a broker config file, as the reference lists them.
CONFIG_TABLES: tuple[tuple[str, type], ...] = (
    ("", ConfigFile),
    ("broker", BrokerConfig),
    ("broker", OldBrokerKeys),
    ("cluster", ClusterTable),
    ("groups", GroupTable),
    ("topics", TopicTable),
    ("limits", RateLimits),
    ("server", OldServerKeys),
)


def toml_value(value: Any) -> str:
    """A default as a TOML file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_value(value.value)
    if isinstance(value, (str, PurePath)):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if attrs.has(type(value)):
        return "(table)"
    return "(unset)" if value is None else str(value)


def _default(field: attrs.Attribute[Any]) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return "(computed)" if default.takes_self else toml_value(default.factory())  # type: ignore[union-attr]
    return toml_value(default)


def _without_none(tp: Any) -> Any:
    """``X | None`` as X: in a file, None is a key left out."""
    args = tuple(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) < len(typing.get_args(tp)):
        return args[0] if len(args) == 1 else typing.Union[args]  # noqa: UP007 - built from a tuple
    return tp


def _nested(field: attrs.Attribute[Any]) -> tuple[type, str] | None:
    """The schema of a field's sub-table (suffix ""), of each table of a table of them (".<name>") or of
    each table of a list of them ("[]")."""
    tp = _without_none(field.type)
    origin = typing.get_origin(tp) or tp
    args = typing.get_args(tp)
    if field.metadata.get("schema") is not None:
        of_tables = len(args) == 2 and (typing.get_origin(args[1]) or args[1]) in (dict, Mapping)
        suffix = ".<name>" if origin in (dict, Mapping) and of_tables else "[]" if origin in (tuple, list) else ""
        return field.metadata["schema"], suffix
    if isinstance(tp, type) and attrs.has(tp):
        return tp, ""
    if origin in (dict, Mapping) and len(args) == 2 and isinstance(args[1], type) and attrs.has(args[1]):
        return args[1], ".<name>"
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _sections(header: str, cls: type) -> Iterator[list[str]]:
    attrs.resolve_types(cls)
    title = f"[[{header[:-2]}]]" if header.endswith("[]") else f"[{header}]" if header else "top level"
    lines = [f"### {title}: {cls.__name__}", "", *inspect.cleandoc(cls.__doc__ or "").splitlines(), "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    nested = []
    for key, field in table_keys(cls).items():
        doc = field.metadata.get("doc", "")
        expected = field.metadata.get("expected") or describe_type(_without_none(field.type))
        lines.append(f"| `{key}` | {_cell(expected)} | `{_cell(_default(field))}` | {_cell(doc)} |")
        sub = _nested(field)
        if sub is not None:
            nested.append((f"{header}.{key}{sub[1]}" if header else f"{key}{sub[1]}", sub[0]))
    yield lines
    for sub_header, sub_cls in nested:
        yield from _sections(sub_header, sub_cls)


def reference(tables: Sequence[tuple[str, type]], title: str = "Configuration reference") -> str:
    """A Markdown page: one section per table (and sub-table) with its keys, types, defaults and docs."""
    out = [f"## {title}", ""]
    for header, cls in tables:
        for lines in _sections(header, cls):
            out.extend([*lines, ""])
    return "\n".join(out).rstrip() + "\n"
