"""Checking a plugin's ``[plugins.<name>]`` table against the options class it declares.

A plugin declares its options as an attrs class (``PluginDeclaration.options``): one field per
key, each with a default and a type annotation, validators for whatever else a value must
satisfy. The core, not each plugin, turns a bad table into one :class:`ConfigError` that names
the plugin, the key, the value and what is expected — for built-in and third-party plugins alike:

1. unknown keys (with a close match and the known keys);
2. every value against its field's annotation (int, float, bool, str, Path, Literal, unions,
   lists, tuples, sets, mappings, enums, classes), so a validator only ever sees a value of the
   declared type: ``"5"`` for an ``int`` field never reaches ``attrs.validators.ge``. A field
   with a converter is checked by its converter instead;
3. the validators, one key at a time, so a refusal names its key. A validator raises
   ValueError, TypeError or a PlugmqError whose message says what is wrong; attrs' own
   validators work as they are. A refusal that only appears with several keys together (a
   validator comparing two fields) names all the keys given.

``attrs.field(metadata={"expected": "a power of two"})`` words the expectation of a field when
its type alone does not say it.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import os
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.core.logs import get_logger

__all__ = ["apply_renamed_options", "build_plugin_options", "describe_type", "value_fits"]

_log = get_logger(__name__)

_SEQUENCES = {list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Collection,
              collections.abc.Iterable, collections.abc.Set, collections.abc.MutableSequence,
              collections.abc.MutableSet}
_MAPPINGS = {dict, collections.abc.Mapping, collections.abc.MutableMapping}
_SHOWN_VALUE_CHARS = 80


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[: _SHOWN_VALUE_CHARS - 3] + "..."


def _kind(value: Any) -> str:
    """How a value reads in a config file: 'a string', 'an integer', 'a list', ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (list, tuple, set, frozenset)):
        return "a list"
    if value is None:
        return "nothing (None)"
    return f"a {type(value).__name__}"


def describe_type(tp: Any) -> str:
    """The expectation an annotation expresses, in config-file words ("an integer", "true or false")."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return "any value"
    if tp is None or tp is type(None):
        return "nothing (None)"
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(describe_type(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if isinstance(tp, type) and issubclass(tp, (PurePath, os.PathLike)):
        return "a path (a string)"
    if origin in _MAPPINGS or tp in _MAPPINGS:
        if len(args) == 2:
            return f"a table of {describe_type(args[0])} -> {describe_type(args[1])}"
        return "a table"
    if origin in _SEQUENCES or tp in _SEQUENCES:
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} items: " + ", ".join(describe_type(a) for a in args)
        if args:
            return f"a list, each item {describe_type(args[0])}"
        return "a list"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"a {tp.__name__}: one of " + ", ".join(repr(m.value) for m in tp)
    if isinstance(tp, type):
        return f"a {tp.__name__}"
    return str(tp)


def value_fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` (as read from TOML or given in Python) is of the annotated type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    if origin is typing.Union or origin is types.UnionType:
        return any(value_fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type) and issubclass(tp, (PurePath, os.PathLike)):
        return isinstance(value, (str, PurePath, os.PathLike))
    if origin in _MAPPINGS or tp in _MAPPINGS:
        if not isinstance(value, Mapping):
            return False
        if len(args) == 2:
            return all(value_fits(k, args[0]) and value_fits(v, args[1]) for k, v in value.items())
        return True
    if origin in _SEQUENCES or tp in _SEQUENCES:
        # TOML has arrays only: a list is accepted wherever a tuple, set or sequence is declared.
        if not isinstance(value, (list, tuple, set, frozenset)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(value_fits(v, a) for v, a in zip(value, args))
        return not args or all(value_fits(v, args[0]) for v in value)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # an annotation this checker does not understand: the validators decide


def _resolved_fields(options_type: type) -> tuple[attrs.Attribute[Any], ...]:
    try:
        attrs.resolve_types(options_type)
    except Exception:  # noqa: BLE001 - an unresolvable annotation only means its type is not checked here
        pass
    return attrs.fields(options_type)


def _reason(exc: BaseException) -> str:
    """The words of a validator's error, without attrs' extra arguments (``Attribute(...)`` reprs)."""
    if isinstance(exc, PlugmqError):
        return str(exc)
    first = exc.args[0] if exc.args else None
    if isinstance(exc, (ValueError, TypeError)) and isinstance(first, str) and first:
        return first
    # Not the error a validator is meant to raise: its type says more than its bare text.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def build_plugin_options(plugin: str, options_type: type | None, table: Mapping[str, Any] | None, *,
                         config_path: str) -> Any:
    """Check ``table`` against ``options_type`` (see the module docstring) and build the options.

    Raises ConfigError: ``<config_path>: plugin '<plugin>', option <key> = <value>: expected ...``.
    """
    table = dict(table or {})
    if options_type is None:
        if table:
            raise ConfigError(f"{config_path}: plugin {plugin!r} takes no options, got {', '.join(sorted(table))}; "
                              "remove them")
        return None
    fields = {f.alias or f.name: f for f in _resolved_fields(options_type) if f.init}
    for key in table:
        if key not in fields:
            raise ConfigError(
                f"{config_path}: unknown option {key!r} for plugin {plugin!r}."
                f"{_suggest(key, fields)} Known options: {', '.join(sorted(fields))}"
            )
    required = [key for key, f in fields.items() if f.default is attrs.NOTHING and key not in table]
    if required:
        raise ConfigError(f"{config_path}: plugin {plugin!r} needs option(s) {', '.join(required)}; add them")
    for key, value in table.items():
        field = fields[key]
        if field.converter is None and field.type is not None and not isinstance(field.type, str) \
                and not value_fits(value, field.type):
            expected = field.metadata.get("expected") or describe_type(field.type)
            raise ConfigError(f"{config_path}: plugin {plugin!r}, option {key} = {_shown(value)}: "
                              f"expected {expected}, got {_kind(value)}")
    try:
        return options_type(**table)
    except Exception as whole:  # noqa: BLE001 - third-party validators may raise anything; each is reported
        failure = whole
    base = {key: table[key] for key, f in fields.items() if f.default is attrs.NOTHING}
    for key, value in table.items():
        try:
            options_type(**{**base, key: value})
        except Exception as exc:
            expected = fields[key].metadata.get("expected")
            hint = f"; expected {expected}" if expected else ""
            raise ConfigError(f"{config_path}: plugin {plugin!r}, option {key} = {_shown(value)} is refused: "
                              f"{_reason(exc)}{hint}") from exc
    given = ", ".join(f"{key} = {_shown(value)}" for key, value in table.items())
    raise ConfigError(f"{config_path}: plugin {plugin!r}: options {given} do not fit together: "
                      f"{_reason(failure)}") from failure


def apply_renamed_options(options: Any, plugin: str, renamed: Mapping[str, str], *,
                          combine: Mapping[str, Callable[[Any, Any], Any]] | None = None) -> None:
    """Accept renamed options: call from an ``@attrs.frozen`` options class's ``__attrs_post_init__``.

    ``renamed`` maps each old field name (a field defaulting to None) to its new one. An old
    option that is set moves to the new field, with a DeprecationWarning and a log line; set beside
    the new one with another value it is a ConfigError naming both. ``combine[new]`` merges an old
    value into the new one instead (several old switches that became one), ``combine(old, new)``.
    """
    defaults = attrs.fields_dict(type(options))
    for old, new in renamed.items():
        value = getattr(options, old)
        if value is None:
            continue
        current = getattr(options, new)
        if combine is not None and new in combine:
            value = combine[new](value, current)
        elif current != defaults[new].default and current != value:
            raise ConfigError(f"plugins.{plugin}: {old} = {value!r} contradicts {new} = {current!r}; "
                              f"{old} is the old name of {new}: keep only {new}")
        warnings.warn(f"plugins.{plugin}.{old} is deprecated; it is now called {new} (see the plugin's options)",
                      DeprecationWarning, stacklevel=4)
        _log.warning("deprecated plugin option", plugin=plugin, option=old, use=new)
        object.__setattr__(options, new, value)
        object.__setattr__(options, old, None)
