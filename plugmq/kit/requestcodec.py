"""Bulk decoding of stored requests for the delay plugins' write-back of a burst.

A delay plugin keeps each delayed message as a record of its own format whose fixed header holds
an AppendRequest's numbers and whose text is ``topic\\x01born host\\x01key\\x01value...`` (UTF-8)
followed by the body. :class:`RequestLayout` says where those fields are; :func:`decode_requests`
decodes many records of one read buffer in one call with the compiled ``_requestcodec``
(``plugmq/kit/_requestcodec.c``) and returns None when that module was not built, so the plugin
decodes record by record in Python (its own decoder is the reference and the fallback). A record
the compiled decoder does not accept - a failed check, or an older format - comes back as None
and is left to the plugin's Python decoder too, which decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.message import AppendRequest
from plugmq.kit.native import Kernel, c_header, layout_version, load_kernel

__all__ = ["HEADER_PATH", "LAYOUT_VERSION", "REQUESTCODEC", "RequestLayout", "decode_requests", "header_text",
           "native_available"]

# AppendRequest's slot descriptors in field order: the compiled decoder fills a new request
# through them, as AppendRequest.trusted does.
_SETTERS = tuple(AppendRequest.__dict__[a.name] for a in attrs.fields(AppendRequest))
_native_disabled = False


@attrs.frozen
class RequestLayout:
    """Where a record format keeps what the compiled decoder reads; offsets from the record's start.

    ``length_at`` holds ``size - length_minus``; the CRC-32 at ``crc_at`` covers
    ``[crc_from, size - crc_back)``; ``tail``: the last 8 bytes repeat (size, magic); ``mark_at``
    (-1: none): a byte that must equal ``mark``. queue id, reconsume times and sys flag are
    int32, tags code, born timestamp and prepared offset int64, lengths uint32; ``body_len_at`` -1:
    the body runs from the end of the text to ``size - crc_back``. ``extras``: (offset, width 4 or
    8) of signed integers returned beside each request."""

    big_endian: bool
    magic_at: int
    magic: int
    length_at: int
    length_minus: int
    crc_at: int
    crc_from: int
    crc_back: int
    tail: bool
    mark_at: int
    mark: int
    queue_at: int
    tags_at: int
    born_at: int
    reconsume_at: int
    sys_flag_at: int
    ptx_at: int
    text_len_at: int
    body_len_at: int
    text_at: int
    extras: tuple[tuple[int, int], ...] = ()

    def packed(self) -> tuple[Any, ...]:
        """The layout as the compiled decoder takes it: the integers in field order, then extras."""
        values = attrs.astuple(self, recurse=False)
        return (*(int(v) for v in values[:-1]), tuple((int(at), int(width)) for at, width in self.extras))


_PACKED: dict[RequestLayout, tuple[Any, ...]] = {}

#: What the compiled decoder is built for: the shape of a packed RequestLayout and of AppendRequest
#: (``_requestcodec_layout.h`` is generated from these by ``python scripts/kernel_headers.py``).
CONSTANTS: dict[str, int] = {
    "FORMAT_VERSION": 1,
    "LAYOUT_ITEMS": len(attrs.fields(RequestLayout)),  # the integers, then the extras tuple
    "REQUEST_FIELDS": len(_SETTERS),
    "MAX_EXTRAS": 8,
    "MAX_DROP": 8,
}
LAYOUT_VERSION = layout_version(CONSTANTS)
HEADER_PATH = Path(__file__).with_name("_requestcodec_layout.h")
REQUESTCODEC = Kernel(
    module="plugmq.kit._requestcodec",
    layout_version=LAYOUT_VERSION,
    users=("delay_wheel", "delay_schedule"),
    fallback="due messages are decoded record by record by the delay plugin's Python decoder",
    cost="decoding a due message takes about 4x the CPU",
)
_native: Any = load_kernel(REQUESTCODEC)  # the extension module, or None


def header_text() -> str:
    return c_header("PLUGMQ_KIT_REQUESTCODEC_LAYOUT_H", "plugmq/kit/requestcodec.py", CONSTANTS)


def _packed(layout: RequestLayout) -> tuple[Any, ...]:
    packed = _PACKED.get(layout)
    if packed is None:
        packed = _PACKED[layout] = layout.packed()
    return packed


def native_available() -> bool:
    """Whether the compiled decoder is there (and not turned off by a test)."""
    return _native is not None and not _native_disabled


def decode_requests(layout: RequestLayout, buffer: bytes | memoryview, positions: Sequence[int],
                    sizes: Sequence[int], drop: Sequence[str] = ()) -> tuple[list[AppendRequest | None], list[int]] | None:
    """The requests of the records at ``positions`` (``sizes`` bytes each) of ``buffer``, without
    the properties in ``drop``, and ``len(layout.extras)`` integers per record; None when the
    compiled decoder is not available. A None request: decode that record in Python."""
    if _native is None or _native_disabled:
        return None
    requests, extras = _native.decode(buffer, positions, sizes, _packed(layout), tuple(drop), AppendRequest, _SETTERS)
    return requests, extras
