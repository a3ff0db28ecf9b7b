"""Broker-side pre-check for SQL92: a 64-bit bloom of a message's property names.

RocketMQ's consume-queue extension stores a bloom filter per message so the broker can skip a
message without reading it. Here a message's bloom is :func:`property_bloom` (3 bits per
property name, from a stable CRC-32 — never Python's salted ``hash()``), and a compiled filter
knows which properties its expression *requires*: names that must be present for the result to be
TRUE. If one of them is surely absent from the bloom the message cannot match.

"Required" follows RocketMQ's null rules exactly, so it is smaller than it looks: ``a = b`` is
TRUE when both are missing, so it requires nothing; ``a IS NULL`` requires nothing; ``a = 5``
requires ``a``; ``a IS NOT NULL`` requires ``a``; ``x OR y`` requires what both sides require.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping

from plugmq.core.names import Prop
from plugmq.plugins.filter_sql import nodes

__all__ = ["BLOOM_BITS_PER_NAME", "name_bits", "property_bloom", "required_properties"]

BLOOM_BITS_PER_NAME = 3


@functools.lru_cache(maxsize=8192)
def name_bits(name: str) -> int:
    """The bloom bits of one property name (a 64-bit mask with up to 3 bits set)."""
    h = zlib.crc32(name.encode("utf-8", "surrogatepass"))
    return (1 << (h & 63)) | (1 << ((h >> 6) & 63)) | (1 << ((h >> 12) & 63))


def property_bloom(properties: Mapping[str, str], tags: str | None = None) -> int:
    """The 64-bit bloom of a message's property names (``TAGS`` counts when tags are given)."""
    bits = 0
    for name in properties:
        bits |= name_bits(name)
    if tags is not None:
        bits |= name_bits(Prop.TAGS)
    return bits


_Need = tuple[frozenset[str], frozenset[str]]  # (needed for TRUE, needed for FALSE)
_NONE: frozenset[str] = frozenset()


def required_properties(node: nodes.Node) -> frozenset[str]:
    """Property names that must be present for ``node`` to evaluate TRUE."""
    return _need(node)[0]


def _props(node: nodes.Node) -> frozenset[str]:
    return frozenset((node.name,)) if isinstance(node, nodes.Property) else _NONE


def _never_null(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Constant) and node.jtype is not nodes.JType.NULL


def _need(node: nodes.Node) -> _Need:
    if isinstance(node, nodes.Constant):
        return _NONE, _NONE
    if isinstance(node, nodes.BooleanCast):
        present = _props(node.operand)
        return present, present
    if isinstance(node, nodes.Not):
        true, false = _need(node.operand)
        return false, true
    if isinstance(node, nodes.Logic):
        parts = [_need(o) for o in node.operands]
        trues = [t for t, _ in parts]
        falses = [f for _, f in parts]
        if node.op == "AND":  # TRUE needs every operand TRUE; FALSE needs one operand FALSE
            return frozenset().union(*trues), frozenset.intersection(*falses)
        return frozenset.intersection(*trues), frozenset().union(*falses)
    if isinstance(node, nodes.Compare):
        if node.op in ("=", "<>"):
            equal = _equal_need(node.left, node.right)
            return equal if node.op == "=" else (equal[1], equal[0])
        both = _props(node.left) | _props(node.right)  # NULL unless both sides are present
        return both, both
    if isinstance(node, nodes.IsNull):
        present = _props(node.operand)
        return (present, _NONE) if node.negated else (_NONE, present)
    if isinstance(node, nodes.Between):
        if node.negated:
            return _need(nodes.Logic(node.pos, "OR", (nodes.Compare(node.pos, "<", node.value, node.low),
                                                      nodes.Compare(node.pos, ">", node.value, node.high))))
        return _need(nodes.Logic(node.pos, "AND", (nodes.Compare(node.pos, ">=", node.value, node.low),
                                                   nodes.Compare(node.pos, "<=", node.value, node.high))))
    if isinstance(node, nodes.In):
        present = _props(node.operand)
        return present, present
    if isinstance(node, nodes.StringMatch):
        return _props(node.operand), _NONE  # missing is FALSE, never TRUE
    return _NONE, _NONE


def _equal_need(left: nodes.Node, right: nodes.Node) -> _Need:
    # TRUE: both missing or both present. FALSE: the left side is present.
    true = _NONE
    if _never_null(left):
        true = _props(right)
    elif _never_null(right):
        true = _props(left)
    return true, _props(left)
