"""The engine: one cattrs converter, strict about TOML types, that checks a table key by key.

See :mod:`plugmq.core.schema` for how a table is judged.
"""

from __future__ import annotations

import enum
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any, cast

import attrs
import cattrs
from cattrs import BaseConverter
from cattrs.cols import list_structure_factory
from cattrs.errors import ClassValidationError, IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, mapping_structure_factory, override

from plugmq.core.schema.declare import (
    ARRAYS,
    MAPPINGS,
    SEQUENCES,
    Expect,
    Mismatch,
    Refusal,
    Refused,
    Validator,
    describe_type,
    table_keys,
)

__all__ = ["converter", "defaults_of", "field_hook"]


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
    build = SEQUENCES[origin]
    if origin is tuple and args and args[-1] is not Ellipsis:
        return _fixed_tuple_hook(tp, args, conv)
    items = list_structure_factory(cast(Any, list[args[0] if args else Any]), conv)  # type: ignore[misc]

    def hook(value: Any, _tp: Any) -> Any:
        if not isinstance(value, ARRAYS):
            raise Mismatch(describe_type(tp), value)
        return build(items(value, list))
    return hook


def _fixed_tuple_hook(tp: Any, args: tuple[Any, ...], conv: BaseConverter) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _tp: Any) -> Any:
        if not isinstance(value, ARRAYS) or len(value) != len(args):
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
        raise Refused(exc) from exc


def _plain_class_hook(tp: Any, _conv: BaseConverter) -> Callable[[Any, Any], Any]:
    return _strict(lambda v: isinstance(v, tp))


def _is_plain_class(tp: Any) -> bool:
    return (isinstance(tp, type) and tp is not Any and not attrs.has(tp) and tp not in SEQUENCES and tp not in MAPPINGS
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
            raise Refused(exc) from exc
        if field.validator is not None:
            try:
                _run_check(field.validator, defaults, field, structured)
            except Refused as exc:
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
    return (typing.get_origin(tp) or tp) in SEQUENCES


def _is_mapping(tp: Any) -> bool:
    return (typing.get_origin(tp) or tp) in MAPPINGS


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
