"""Reporting: every error inside cattrs' error groups as one line with its key path.

See :mod:`plugmq.core.schema` for the wording.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, TypeVar

import attrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from plugmq.core.errors import ConfigError
from plugmq.core.schema.declare import Refusal, Refused, reason, table_keys
from plugmq.core.schema.engine import converter

__all__ = ["KeyPath", "Problems", "dotted", "leaves", "problems", "structure"]

T = TypeVar("T")
KeyPath = tuple[str | int, ...]


def leaves(exc: BaseException, path: KeyPath = (), owner: type | None = None
           ) -> Iterator[tuple[KeyPath, BaseException, type | None]]:
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


def dotted(path: KeyPath, source: str = "", *, headers: bool = False) -> str:
    """``("groups", "g", "backoff_s", 1)`` as ``groups.g.backoff_s[1]``, after ``<source>: ``.

    ``headers``: a path of one key names a top-level table, shown as ``[groups]``.
    """
    text = f"[{path[0]}]" if headers and len(path) == 1 else ""
    for part in path if not text else ():
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return f"{source}: {text}" if source and text else (source or text)


def _unknown_lines(exc: ForbiddenExtraKeysError, path: KeyPath, source: str) -> list[str]:
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


def problems(exc: BaseException, source: str = "", path: KeyPath = (), *, headers: bool = False) -> list[str]:
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


def structure(data: Any, cls: type[T], source: str = "", path: KeyPath = (), *, headers: bool = False) -> T:
    """``data`` as a ``cls``; a ConfigError with every problem (one line each) if it does not fit.

    Lines read ``<source>: <key path> ...``; ``path`` is where ``data`` sits in its file.
    """
    try:
        return converter.structure(data, cls)
    except (ClassValidationError, IterableValidationError, Refusal, Refused) as exc:
        raise ConfigError(*problems(exc, source, path, headers=headers)) from None


class Problems:
    """Every problem of one file, collected table by table: a bad table does not hide the next.

    ``source`` opens every line (the file's name; "" for none); ``headers`` as in :func:`problems`.
    """

    def __init__(self, source: str = "", *, headers: bool = False) -> None:
        self.source = source
        self.headers = headers
        self.lines: list[str] = []

    def structure(self, data: Any, cls: type[T], path: KeyPath = ()) -> T | None:
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

    def add_at(self, path: KeyPath, phrase: str, *, colon: bool = False) -> None:
        """A problem of the key at ``path``: ``<path> <phrase>`` (``<path>: <phrase>`` with ``colon``)."""
        self.lines.append(f"{dotted(path, self.source, headers=self.headers)}{': ' if colon else ' '}{phrase}")

    def raise_any(self) -> None:
        """Raise one ConfigError listing every problem recorded, if any."""
        if self.lines:
            raise ConfigError(*self.lines)
