"""Hash codes that must match RocketMQ bit for bit (never Python's salted ``hash()``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

__all__ = ["TAG_SEPARATOR", "java_string_hash", "split_tags", "tags_code"]

#: Separator of tags in a subscription expression and in a multi-tag message's TAGS property.
TAG_SEPARATOR = "||"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: over UTF-16 code units, as a signed 32-bit int.

    Widening the result to 64 bits (what RocketMQ stores in the consume queue) keeps the value.
    """
    h = 0
    for unit in memoryview(text.encode(_UTF16_NATIVE, "surrogatepass")).cast("H"):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"  # code units in native order
_TAGS_CODES: dict[str, int] = {}  # tags text -> code: senders reuse a handful of tags
_TAGS_CODES_LIMIT = 4096


def split_tags(tags: str | None) -> list[str]:
    """The tags of a TAGS property or subscription: split on ``||``, trimmed, empty ones dropped."""
    if not tags:
        return []
    return [t.strip() for t in tags.split(TAG_SEPARATOR) if t.strip()]


def tags_code(tags: str | Iterable[str] | None) -> int:
    """The consume-queue tag field for a message's tags.

    One tag: its Java hash code (RocketMQ's ``tagsString2tagsCode``). Several tags (seed 000's
    multi-tag variant): the OR of their hash codes, so a subscription tag ``t`` can match when
    ``code(t) & entry == code(t)``. No tag: 0.
    """
    if tags is None:
        return 0
    if isinstance(tags, str):
        code = _TAGS_CODES.get(tags)
        if code is None:
            code = _or_of_hashes(split_tags(tags))
            if len(_TAGS_CODES) >= _TAGS_CODES_LIMIT:
                _TAGS_CODES.clear()
            _TAGS_CODES[tags] = code
        return code
    return _or_of_hashes(list(tags))


def _or_of_hashes(names: list[str]) -> int:
    code = 0
    for name in names:
        code |= java_string_hash(name)
    return code
