"""filter_tag: tag subscriptions (expression type ``TAG``) with a broker-side hash pre-check.

The pre-check reads only the consume-queue tag code (one entry at a time, or a whole block of
raw 20-byte entries with numpy: :func:`precheck_block`, ``TagFilter.precheck_many``); the exact
check compares tag strings on the client.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plugmq.core import Family, FilterCompiler, PluginDeclaration, hookimpl
from plugmq.plugins.filter_tag.tagfilter import (
    EXPRESSION_TYPE,
    TagFilter,
    TagFilterCompiler,
    precheck_block,
)

if TYPE_CHECKING:
    from plugmq.plugins.filter_tag.vectorised import (
        CQ_ENTRY_DTYPE,
        decode_block,
        encode_block,
        match_codes,
    )

__all__ = [
    "COMPILER",
    "CQ_ENTRY_DTYPE",
    "TagFilter",
    "TagFilterCompiler",
    "decode_block",
    "encode_block",
    "match_codes",
    "plugmq_declare",
    "plugmq_filter_compilers",
    "precheck_block",
]

COMPILER = TagFilterCompiler()


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="filter_tag",
        families={Family.FILTER},
        description="Tag subscriptions (TAGA || TAGB, *): hash pre-check on the broker, exact check on the client",
        options=None,
        capabilities=COMPILER.capabilities,
    )


@hookimpl
def plugmq_filter_compilers() -> Mapping[str, FilterCompiler]:
    return {EXPRESSION_TYPE: COMPILER}


_VECTORISED = {"CQ_ENTRY_DTYPE", "decode_block", "encode_block", "match_codes"}


def __getattr__(name: str) -> Any:
    """The numpy half loads on first use: a broker that never pre-checks a raw block (any store
    but store_mmap) does not import numpy for this plugin."""
    if name in _VECTORISED:
        return getattr(importlib.import_module("plugmq.plugins.filter_tag.vectorised"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
