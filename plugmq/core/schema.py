"""The configuration engine: TOML tables structured into attrs classes, every error collected.

A table's schema is an attrs class: one field per key, declared with :func:`setting` (its default,
its documentation, the validators its value must pass). One cattrs converter structures a table
into that class (:func:`structure`) and reports *every* problem at once, as a ConfigError whose
``problems`` are one line each, in one wording for every table::

    broker.toml: broker.default_queue_count must be >= 1, got 0
    broker.toml: broker.nmae: unknown key. Did you mean 'name'? Known keys: ...
    broker.toml: groups.g.backoff_s[1] must be a number of seconds > 0, got -2

How a value is judged:

1. its type, strictly, as a TOML file writes it: ``"5"`` is no integer and ``true`` is no number;
   a list is accepted wherever a tuple, set or sequence is declared (TOML has arrays only);
2. the field's validators, one key at a time (a refusal names its key). Each runs against the
   class's defaults for the other keys; a check that only fails with several keys together is
   raised when the whole table is built (a :class:`Refusal` with ``key`` names the key it blames);
3. unknown keys, named with the closest known key; missing required keys, with their doc.

``Annotated[T, Expect("a plugin name")]`` words (and may check) the items of a list or the keys
and values of a table. Validators raise :class:`Refusal` (``must be >= 1, got 0``: it reads on from
the key path) or any ValueError / PlugmqError whose text says what is wrong.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePath
from typing import Any, TypeVar, cast

import attrs
import cattrs
from cattrs import BaseConverter
from cattrs.cols import list_structure_factory
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, mapping_structure_factory, override

from plugmq.core.errors import ConfigError, PlugmqError

__all__ = [
    "Expect",
    "Mismatch",
    "Problems",
    "Refusal",
    "above",
    "at_least",
    "at_most",
    "calls",
    "converter",
    "defaults_of",
    "describe_type",
    "dotted",
    "field_hook",
    "internal",
    "leaves",
    "non_empty",
    "one_of",
    "problems",
    "reason",
    "setting",
    "shown",
    "structure",
    "table_keys",
]

T = TypeVar("T")
Validator = Callable[[Any, Any, Any], None]

_SHOWN_VALUE_CHARS = 80
_SEQUENCES: dict[Any, type] = {  # declared collection -> what a TOML array becomes
    list: list, tuple: tuple, set: set, frozenset: frozenset,
    collections.abc.Sequence: tuple, collections.abc.Collection: tuple, collections.abc.Iterable: tuple,
    collections.abc.MutableSequence: list, collections.abc.Set: frozenset, collections.abc.MutableSet: set,
}
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_ARRAYS = (list, tuple, set, frozenset)


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


class _Refused(Exception):
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
    if isinstance(exc, _Refused):
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
            expected: str | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A key of a table: its default (none: required), its documentation and its checks.

    ``expected`` words what a value must be when the type alone does not say it well.
    """
    metadata = {"doc": doc} if expected is None else {"doc": doc, "expected": expected}
    return attrs.field(default=default, factory=factory, validator=validator, metadata=metadata)


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
    if origin in _MAPPINGS or tp in _MAPPINGS:
        return f"a table of {describe_type(args[0])} -> {describe_type(args[1])}" if len(args) == 2 else "a table"
    if origin in _SEQUENCES or tp in _SEQUENCES:
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


# ------------------------------------------------------------------------------------------ the converter
def _strict(check: Callable[[Any], bool], make: Callable[[Any], Any] = lambda v: v) -> Callable[[Any, Any], Any]:
    def hook(value: Any, tp: Any) -> Any:
        if not check(value):
            raise Mismatch(describe_type(tp), value)
        return make(value)
    return hook


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_path_type(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, (PurePath, os.PathLike))


def _collection_hook(tp: Any, conv: BaseConverter) -> Callable[[Any, Any], Any]:
    origin = typing.get_origin(tp) or tp
    args = typing.get_args(tp)
    build = _SEQUENCES[origin]
    if origin is tuple and args and args[-1] is not Ellipsis:
        return _fixed_tuple_hook(tp, args, conv)
    items = list_structure_factory(cast(Any, list[args[0] if args else Any]), conv)  # type: ignore[misc]

    def hook(value: Any, _tp: Any) -> Any:
        if not isinstance(value, _ARRAYS):
            raise Mismatch(describe_type(tp), value)
        return build(items(value, list))
    return hook


def _fixed_tuple_hook(tp: Any, args: tuple[Any, ...], conv: BaseConverter) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _tp: Any) -> Any:
        if not isinstance(value, _ARRAYS) or len(value) != len(args):
            raise Mismatch(describe_type(tp), value)
        out, errors = [], []
        for index, (item, item_type) in enumerate(zip(value, args)):
            try:
                out.append(conv.structure(item, item_type))
            except Exception as exc:  # noqa: BLE001 - collected, each with its index
                exc.__notes__ = [*getattr(exc, "__notes__", []), IterableValidationNote(f"@ {index}", index, item_type)]
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {tp!r}", errors, tp)
        return tuple(out)
    return hook


def _mapping_hook(tp: Any, conv: BaseConverter) -> Callable[[Any, Any], Any]:
    args = typing.get_args(tp)
    inner = mapping_structure_factory(cast(Any, dict[args[0], args[1]] if len(args) == 2 else dict), conv)  # type: ignore[valid-type]

    def hook(value: Any, _tp: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Mismatch(describe_type(tp), value)
        return inner(value, tp)
    return hook


def _union_hook(tp: Any, conv: BaseConverter) -> Callable[[Any, Any], Any]:
    args = typing.get_args(tp)
    others = [a for a in args if a is not type(None)]

    def hook(value: Any, _tp: Any) -> Any:
        if value is None and len(others) < len(args):
            return None
        if len(others) == 1:  # an optional value: the errors of its one type say more
            return conv.structure(value, others[0])
        for member in others:
            try:
                return conv.structure(value, member)
            except Exception:  # noqa: BLE001 - the next member may fit
                continue
        raise Mismatch(describe_type(tp), value)
    return hook


def _literal_hook(tp: Any, _conv: BaseConverter) -> Callable[[Any, Any], Any]:
    choices = typing.get_args(tp)
    return _strict(lambda v: any(v == c and type(v) is type(c) for c in choices))


def _enum_hook(tp: Any, _conv: BaseConverter) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _tp: Any) -> Any:
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            raise Mismatch(describe_type(tp), value) from None
    return hook


def _annotated_hook(tp: Any, conv: BaseConverter) -> Callable[[Any, Any], Any]:
    base = typing.get_args(tp)[0]
    marks = [m for m in tp.__metadata__ if isinstance(m, Expect)]

    def hook(value: Any, _tp: Any) -> Any:
        try:
            structured = conv.structure(value, base)
        except Mismatch:
            raise Mismatch(marks[0].words, value) from None
        for mark in marks:
            if mark.check is not None and not mark.check(structured):
                raise Mismatch(mark.words, value)
        return structured
    return hook


def _run_check(check: Validator, inst: Any, field: Any, value: Any) -> None:
    try:
        check(inst, field, value)
    except Refusal:
        raise
    except Exception as exc:
        raise _Refused(exc) from exc


def _plain_class_hook(tp: Any, _conv: BaseConverter) -> Callable[[Any, Any], Any]:
    return _strict(lambda v: isinstance(v, tp))


def _is_plain_class(tp: Any) -> bool:
    return (isinstance(tp, type) and tp is not Any and not attrs.has(tp) and tp not in _SEQUENCES and tp not in _MAPPINGS
            and not issubclass(tp, (enum.Enum, PurePath, os.PathLike)) and tp not in (int, float, bool, str))


def defaults_of(cls: type) -> types.SimpleNamespace:
    """The class's defaults, for validators that read another field (judged alone, with defaults)."""
    values = {}
    for field in attrs.fields(cls):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            if not field.default.takes_self:
                values[field.name] = field.default.factory()
        elif field.default is not attrs.NOTHING:
            values[field.name] = field.default
    return types.SimpleNamespace(**values)


def field_hook(field: attrs.Attribute[Any], defaults: Any, conv: BaseConverter, *,
               as_given: bool = False) -> Callable[[Any, Any], Any]:
    """Structure one key's value: its type (or converter), then its validators against ``defaults``.

    ``as_given``: return the value as the table gives it (the class's own converters apply).
    """
    tp = field.type
    typed = tp is not None and not isinstance(tp, str)
    converter_ = field.converter if callable(field.converter) and not isinstance(field.converter, attrs.Converter) \
        else None
    expected = field.metadata.get("expected")

    def hook(value: Any, _tp: Any) -> Any:
        try:
            if converter_ is not None:
                structured = converter_(value)
            else:
                structured = conv.structure(value, cast(Any, tp)) if typed else value
        except Mismatch as exc:
            raise (Mismatch(expected, value) if expected else exc) from None
        except (ClassValidationError, IterableValidationError, Refusal):
            raise
        except Exception as exc:  # a converter may raise anything; its words are kept
            raise _Refused(exc) from exc
        if field.validator is not None:
            try:
                _run_check(field.validator, defaults, field, structured)
            except _Refused as exc:
                if not isinstance(exc.cause, AttributeError):  # reads a key judged with the others
                    raise
        return value if as_given else structured
    return hook


def _attrs_hook(cls: type, conv: BaseConverter) -> Callable[[Any, Any], Any]:
    attrs.resolve_types(cls)
    defaults = defaults_of(cls)
    keys = table_keys(cls)
    overrides = {f.name: override(struct_hook=field_hook(f, defaults, conv)) if f.name in
                 {k.name for k in keys.values()} else override(omit=True) for f in attrs.fields(cls)}
    inner: Callable[[Any, Any], Any] = cast(Any, make_dict_structure_fn)(
        cls, conv, _cattrs_forbid_extra_keys=True, _cattrs_use_alias=True, **overrides)

    def hook(value: Any, _tp: Any) -> Any:
        if isinstance(value, cls):  # Python callers may hand a built value
            return value
        if not isinstance(value, Mapping):
            raise Mismatch("a table", value)
        return inner(value, cls)
    return hook


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _is_collection(tp: Any) -> bool:
    return (typing.get_origin(tp) or tp) in _SEQUENCES


def _is_mapping(tp: Any) -> bool:
    return (typing.get_origin(tp) or tp) in _MAPPINGS


def _is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is typing.Literal


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _is_expected(tp: Any) -> bool:
    return typing.get_origin(tp) is typing.Annotated and any(isinstance(m, Expect) for m in tp.__metadata__)


def _path_hook(tp: Any, _conv: BaseConverter) -> Callable[[Any, Any], Any]:
    return _strict(lambda v: isinstance(v, (str, PurePath, os.PathLike)), tp)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _strict(_is_int))
    conv.register_structure_hook(float, _strict(_is_number, float))
    conv.register_structure_hook(bool, _strict(lambda v: isinstance(v, bool)))
    conv.register_structure_hook(str, _strict(lambda v: isinstance(v, str)))
    conv.register_structure_hook(type(None), _strict(lambda v: v is None))
    factories: list[tuple[Callable[[Any], bool], Callable[[Any, BaseConverter], Callable[[Any, Any], Any]]]] = [
        (_is_plain_class, _plain_class_hook), (_is_path_type, _path_hook), (_is_enum, _enum_hook),
        (attrs.has, _attrs_hook), (_is_collection, _collection_hook), (_is_mapping, _mapping_hook),
        (_is_literal, _literal_hook), (_is_union, _union_hook), (_is_expected, _annotated_hook)]
    for predicate, factory in factories:  # the later, the more it takes precedence
        conv.register_structure_hook_factory(predicate, cast(Any, factory))
    return conv


#: The one converter every table of plugmq goes through.
converter = _make_converter()


# ------------------------------------------------------------------------------------------ reporting
Path_ = tuple[str | int, ...]


def leaves(exc: BaseException, path: Path_ = (), owner: type | None = None
           ) -> Iterator[tuple[Path_, BaseException, type | None]]:
    """Every single error inside cattrs' error groups, with its key path and the class it is a key of."""
    if isinstance(exc, ClassValidationError):
        noted, others = exc.group_exceptions()
        for sub, note in noted:
            yield from leaves(sub, (*path, _key_of(exc.cl, note)), exc.cl)
        for sub in others:
            yield from leaves(sub, path, exc.cl)
    elif isinstance(exc, IterableValidationError):
        noted_items, other_items = exc.group_exceptions()
        for sub, item in noted_items:
            yield from leaves(sub, (*path, item.index), None)
        for sub in other_items:
            yield from leaves(sub, path, owner)
    else:
        yield path, exc, owner


def _key_of(cls: type, note: AttributeValidationNote) -> str:
    field = attrs.fields_dict(cls).get(note.name)
    return (field.alias or field.name) if field is not None else note.name


def dotted(path: Path_, source: str = "", *, headers: bool = False) -> str:
    """``("groups", "g", "backoff_s", 1)`` as ``groups.g.backoff_s[1]``, after ``<source>: ``.

    ``headers``: a path of one key names a top-level table, shown as ``[groups]``.
    """
    text = f"[{path[0]}]" if headers and len(path) == 1 else ""
    for part in path if not text else ():
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return f"{source}: {text}" if source and text else (source or text)


def _unknown_lines(exc: ForbiddenExtraKeysError, path: Path_, source: str) -> list[str]:
    known = sorted(table_keys(exc.cl))
    lines = []
    for key in sorted(exc.extra_fields, key=str):
        close = difflib.get_close_matches(str(key), known, n=1)
        if path:
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"{dotted((*path, key), source)}: unknown key.{hint} Known keys: {', '.join(known)}")
        else:
            hint = f" Did you mean [{close[0]}]?" if close else ""
            tables = ", ".join(f"[{k}]" for k in known)
            lines.append(f"{dotted((), source)}{': ' if source else ''}unknown top-level table [{key}].{hint} "
                         f"Known tables: {tables}")
    return lines


def problems(exc: BaseException, source: str = "", path: Path_ = (), *, headers: bool = False) -> list[str]:
    """One line per error inside ``exc``: the key path after ``<source>: ``, the value, what is expected.

    ``headers``: the first key of a path names a top-level table (``[groups] must be a table``).
    """
    lines: list[str] = []
    for where, leaf, owner in leaves(exc, path):
        if isinstance(leaf, ForbiddenExtraKeysError):
            lines.extend(_unknown_lines(leaf, where, source))
        elif isinstance(leaf, KeyError) and owner is not None and where:
            field = table_keys(owner).get(str(where[-1]))
            doc = f" ({field.metadata['doc']})" if field is not None and "doc" in field.metadata else ""
            lines.append(f"{dotted(where, source, headers=headers)} is required{doc}; add it")
        elif isinstance(leaf, Refusal):
            target = (*where, leaf.key) if leaf.key else where
            lines.append(f"{dotted(target, source, headers=headers)}{leaf.joint}{leaf.phrase}")
        else:
            lines.append(f"{dotted(where, source, headers=headers)}: {reason(leaf)}")
    return lines


def structure(data: Any, cls: type[T], source: str = "", path: Path_ = (), *, headers: bool = False) -> T:
    """``data`` as a ``cls``; a ConfigError with every problem (one line each) if it does not fit.

    Lines read ``<source>: <key path> ...``; ``path`` is where ``data`` sits in its file.
    """
    try:
        return converter.structure(data, cls)
    except (ClassValidationError, IterableValidationError, Refusal, _Refused) as exc:
        raise ConfigError(*problems(exc, source, path, headers=headers)) from None


class Problems:
    """Every problem of one file, collected table by table: a bad table does not hide the next.

    ``source`` opens every line (the file's name; "" for none); ``headers`` as in :func:`problems`.
    """

    def __init__(self, source: str = "", *, headers: bool = False) -> None:
        self.source = source
        self.headers = headers
        self.lines: list[str] = []

    def structure(self, data: Any, cls: type[T], path: Path_ = ()) -> T | None:
        """``data`` as a ``cls``, or None with its problems recorded."""
        try:
            return structure(data, cls, self.source, path, headers=self.headers)
        except ConfigError as exc:
            self.extend(exc)
            return None

    def extend(self, exc: ConfigError) -> None:
        """Record the problems of a ConfigError (once each)."""
        self.lines.extend(line for line in exc.problems if line not in self.lines)

    def add(self, text: str) -> None:
        """A problem whose text names its keys."""
        self.lines.append(f"{self.source}: {text}" if self.source else text)

    def add_at(self, path: Path_, phrase: str, *, colon: bool = False) -> None:
        """A problem of the key at ``path``: ``<path> <phrase>`` (``<path>: <phrase>`` with ``colon``)."""
        self.lines.append(f"{dotted(path, self.source, headers=self.headers)}{': ' if colon else ' '}{phrase}")

    def raise_any(self) -> None:
        """Raise one ConfigError listing every problem recorded, if any."""
        if self.lines:
            raise ConfigError(*self.lines)

