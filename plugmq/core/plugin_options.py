"""Checking a plugin's ``[plugins.<name>]`` table against the options class it declares.

A plugin declares its options as an attrs class (``PluginDeclaration.options``): one field per
key, each with a default and a type annotation, validators for whatever else a value must
satisfy. The core, not each plugin, checks a table with the configuration engine
(:mod:`plugmq.core.schema`, the one every table of plugmq goes through) and turns a bad table into
one :class:`ConfigError` naming the plugin, and for every problem the key, the value and what is
expected — for built-in and third-party plugins alike:

1. unknown keys (with a close match and the known keys), missing required keys;
2. every value against its field's annotation (int, float, bool, str, Path, Literal, unions,
   lists, tuples, sets, mappings, enums, classes), so a validator only ever sees a value of the
   declared type: ``"5"`` for an ``int`` field never reaches ``attrs.validators.ge``. A field
   with a converter is checked by its converter instead;
3. the validators, one key at a time (the others at their defaults), so a refusal names its key.
   A validator raises ValueError, TypeError or a PlugmqError whose message says what is wrong;
   attrs' own validators work as they are. A refusal that only appears with several keys
   together (a validator comparing two fields) names all the keys given.

Values reach the options class as the table writes them (a TOML array stays a list): the class's
own converters decide what to make of them. ``attrs.field(metadata={"expected": "a power of two"})``
words the expectation of a field when its type alone does not say it.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
from cattrs.errors import ClassValidationError
from cattrs.gen import make_dict_structure_fn, override

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.schema import Mismatch, converter, defaults_of, describe_type, field_hook, leaves, reason, shown

__all__ = ["apply_renamed_options", "build_plugin_options", "describe_type", "value_fits"]

_log = get_logger(__name__)


def _kind(value: Any) -> str:
    """How a value reads in a config file: 'a string', 'an integer', 'a list', ..."""
    if value is None:
        return "nothing (None)"
    for kind, words in ((bool, "a boolean"), (int, "an integer"), (float, "a number with a fraction"),
                        (str, "a string"), (Mapping, "a table"), ((list, tuple, set, frozenset), "a list")):
        if isinstance(value, kind):
            return words
    return f"a {type(value).__name__}"


def value_fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` (as read from TOML or given in Python) is of the annotated type."""
    if tp is None:
        return value is None
    if isinstance(tp, str):
        return True  # an unresolved annotation: the validators decide
    try:
        converter.structure(value, tp)
    except Exception:  # noqa: BLE001 - any refusal means: it does not fit
        return False
    return True


def _fields(options_type: type) -> dict[str, attrs.Attribute[Any]]:
    try:
        attrs.resolve_types(options_type)
    except Exception:  # noqa: BLE001 - an unresolvable annotation only means its type is not checked here
        pass
    return {f.alias or f.name: f for f in attrs.fields(options_type) if f.init}


@functools.cache
def _structure_fn(options_type: type) -> Callable[[Mapping[str, Any], Any], Any]:
    """The engine's structure function for a plugin's class: values checked, passed on as given."""
    fields = _fields(options_type)
    defaults = defaults_of(options_type)
    overrides = {f.name: override(struct_hook=field_hook(f, defaults, converter, as_given=True))
                 for f in fields.values()}
    structure_fn: Callable[[Mapping[str, Any], Any], Any] = cast(Any, make_dict_structure_fn)(
        options_type, converter, _cattrs_forbid_extra_keys=True, _cattrs_use_alias=True, **overrides)
    return structure_fn


def _problem(plugin: str, fields: Mapping[str, attrs.Attribute[Any]], table: Mapping[str, Any],
             key: str, leaf: BaseException, nested: bool) -> str:
    field = fields[key]
    value = table[key]
    expected = field.metadata.get("expected")
    if nested or isinstance(leaf, Mismatch):
        return (f"plugin {plugin!r}, option {key} = {shown(value)}: expected "
                f"{expected or describe_type(field.type)}, got {_kind(value)}")
    hint = f"; expected {expected}" if expected else ""
    return f"plugin {plugin!r}, option {key} = {shown(value)} is refused: {reason(leaf)}{hint}"


def _problems(plugin: str, options_type: type, table: Mapping[str, Any], error: ClassValidationError) -> list[str]:
    """The engine's errors in the words plugin tables have always had."""
    fields = _fields(options_type)
    lines: list[str] = []
    missing: list[str] = []
    for path, leaf, _owner in leaves(error):
        if not path:
            unknown = sorted(getattr(leaf, "extra_fields", ()))
            for key in unknown:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                lines.append(f"unknown option {key!r} for plugin {plugin!r}.{hint} Known options: "
                             f"{', '.join(sorted(fields))}")
            if not unknown:
                given = ", ".join(f"{key} = {shown(value)}" for key, value in table.items())
                lines.append(f"plugin {plugin!r}: options {given} do not fit together: {reason(leaf)}")
        elif isinstance(leaf, KeyError) and len(path) == 1 and path[0] not in table:
            missing.append(str(path[0]))
        else:
            line = _problem(plugin, fields, table, str(path[0]), leaf, len(path) > 1)
            if line not in lines:
                lines.append(line)
    if missing:
        lines.append(f"plugin {plugin!r} needs option(s) {', '.join(missing)}; add them")
    return lines


def build_plugin_options(plugin: str, options_type: type | None, table: Mapping[str, Any] | None, *,
                         config_path: str) -> Any:
    """Check ``table`` against ``options_type`` (see the module docstring) and build the options.

    Raises ConfigError, one problem per line:
    ``<config_path>: plugin '<plugin>', option <key> = <value>: expected ...``.
    """
    table = dict(table or {})
    if options_type is None:
        if table:
            raise ConfigError(f"{config_path}: plugin {plugin!r} takes no options, got {', '.join(sorted(table))}; "
                              "remove them")
        return None
    try:
        return _structure_fn(options_type)(table, options_type)
    except ClassValidationError as error:
        raise ConfigError(*(f"{config_path}: {line}" for line in _problems(plugin, options_type, table, error))) \
            from error


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
