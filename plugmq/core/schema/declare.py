"""Declaring a table's schema: keys (:func:`setting`), their checks, and the words of refusals.

See :mod:`plugmq.core.schema` for how a table is judged.
"""

from __future__ import annotations

import collections.abc
import enum
import os
import types
import typing
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, PlugmqError

__all__ = [
    "ARRAYS",
    "MAPPINGS",
    "SEQUENCES",
    "Expect",
    "Mismatch",
    "Refusal",
    "Refused",
    "Validator",
    "above",
    "at_least",
    "at_most",
    "calls",
    "describe_type",
    "internal",
    "non_empty",
    "one_of",
    "reason",
    "setting",
    "shown",
    "table_keys",
]

Validator = Callable[[Any, Any, Any], None]

_SHOWN_VALUE_CHARS = 80
SEQUENCES: dict[Any, type] = {  # declared collection -> what a TOML array becomes
    list: list, tuple: tuple, set: set, frozenset: frozenset,
    collections.abc.Sequence: tuple, collections.abc.Collection: tuple, collections.abc.Iterable: tuple,
    collections.abc.MutableSequence: list, collections.abc.Set: frozenset, collections.abc.MutableSet: set,
}
MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
ARRAYS = (list, tuple, set, frozenset)


# ------------------------------------------------------------------------------------------ refusals
class Refusal(ConfigError):
    """A value the schema refuses, worded to follow its key path: ``<path> <phrase>``.

    ``key`` (for checks of several keys, raised when a table is built) names the key it blames,
    relative to the table. ``colon``: the phrase is a sentence of its own, ``<path>: <phrase>``.
    """

    def __init__(self, phrase: str, *, key: str | None = None, colon: bool = False) -> None:
        self.joint = ": " if colon else " "
        super().__init__(f"{key}{self.joint}{phrase}" if key else phrase)
        self.phrase = phrase
        self.key = key


class Mismatch(Refusal):
    """A value of the wrong type: ``must be <expected>, got <value>``."""

    def __init__(self, expected: str, value: Any) -> None:
        super().__init__(f"must be {expected}, got {shown(value)}")
        self.expected = expected
        self.value = value


class Refused(Exception):
    """A validator's own error (any type), kept for the wording of its message."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(reason(cause))
        self.cause = cause


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[: _SHOWN_VALUE_CHARS - 3] + "..."


def reason(exc: BaseException) -> str:
    """The words of a validator's error, without attrs' extra arguments (``Attribute(...)`` reprs)."""
    if isinstance(exc, Refused):
        return reason(exc.cause)
    if isinstance(exc, PlugmqError):
        return str(exc)
    first = exc.args[0] if exc.args else None
    if isinstance(exc, (ValueError, TypeError)) and isinstance(first, str) and first:
        return first
    # Not the error a validator is meant to raise: its type says more than its bare text.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# ------------------------------------------------------------------------------------------ declaring
def setting(default: Any = attrs.NOTHING, *, doc: str, validator: Validator | list[Validator] | None = None,
            expected: str | None = None, factory: Callable[[], Any] | None = None, schema: type | None = None) -> Any:
    """A key of a table: its default (none: required), its documentation and its checks.

    ``expected`` words what a value must be when the type alone does not say it well. ``schema``:
    the class a sub-table (or each table of a table or list of them) is checked against later, by
    the reader (the reference documents its keys).
    """
    metadata = {"doc": doc, "expected": expected, "schema": schema}
    return attrs.field(default=default, factory=factory, validator=validator,
                       metadata={k: v for k, v in metadata.items() if v is not None})


def internal(default: Any = attrs.NOTHING, *, doc: str, factory: Callable[[], Any] | None = None) -> Any:
    """A field filled in by the reader, not a key of the table (a file may not set it)."""
    return attrs.field(default=default, factory=factory, metadata={"doc": doc, "key": False})


@attrs.frozen
class Expect:
    """``Annotated[T, Expect(words, check)]``: how a T is described, and a test it must also pass."""

    words: str
    check: Callable[[Any], bool] | None = None


def at_least(low: float, note: str = "") -> Validator:
    """Refuse values below ``low`` (``note`` says what the bound means)."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        if value < low:
            raise Refusal(f"must be >= {low}{note}, got {shown(value)}")
    return check


def above(low: float) -> Validator:
    """Refuse values at or below ``low``."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        if not value > low:
            raise Refusal(f"must be > {low}, got {shown(value)}")
    return check


def at_most(high: float) -> Validator:
    """Refuse values above ``high``."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        if value > high:
            raise Refusal(f"must be <= {high}, got {shown(value)}")
    return check


def one_of(*choices: Any) -> Validator:
    """Refuse values other than ``choices``."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        if value not in choices:
            raise Refusal(f"must be one of {', '.join(map(str, choices))}, got {shown(value)}")
    return check


def calls(function: Callable[[Any], object]) -> Validator:
    """A validator out of a checking function (it raises with its own words)."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        function(value)
    return check


def non_empty(fix: str) -> Validator:
    """Refuse an empty list or string; ``fix`` says what to write instead."""
    def check(_inst: object, _attr: object, value: Any) -> None:
        if not value:
            raise Refusal(f"is empty; {fix}")
    return check


def table_keys(cls: type) -> dict[str, attrs.Attribute[Any]]:
    """The keys a table of ``cls`` takes: its init fields that are not ``internal``, by key name."""
    return {f.alias or f.name: f for f in attrs.fields(cls) if f.init and f.metadata.get("key", True)}


# ------------------------------------------------------------------------------------------ wording
def _describe_generic(tp: Any, origin: Any, args: tuple[Any, ...]) -> str | None:
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(describe_type(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        marks = [m for m in tp.__metadata__ if isinstance(m, Expect)]
        return marks[0].words if marks else describe_type(args[0])
    if origin in MAPPINGS or tp in MAPPINGS:
        return f"a table of {describe_type(args[0])} -> {describe_type(args[1])}" if len(args) == 2 else "a table"
    if origin in SEQUENCES or tp in SEQUENCES:
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} items: " + ", ".join(describe_type(a) for a in args)
        return f"a list, each item {describe_type(args[0])}" if args else "a list"
    return None


_WORDS: dict[Any, str] = {Any: "any value", object: "any value", None: "nothing (None)",
                          type(None): "nothing (None)", bool: "true or false", int: "an integer",
                          float: "a number", str: "a string"}


def describe_type(tp: Any) -> str:
    """The expectation an annotation expresses, in config-file words ("an integer", "true or false")."""
    if isinstance(tp, str):
        return tp
    words = _WORDS.get(tp) if typing.get_origin(tp) is None else None
    if words is not None:
        return words
    generic = _describe_generic(tp, typing.get_origin(tp), typing.get_args(tp))
    if generic is not None:
        return generic
    if isinstance(tp, type) and issubclass(tp, (PurePath, os.PathLike)):
        return "a path (a string)"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"a {tp.__name__}: one of " + ", ".join(repr(m.value) for m in tp)
    if attrs.has(tp):
        return "a table"
    return f"a {tp.__name__}" if isinstance(tp, type) else str(tp)
