"""store_mmap's on-disk layout, written once: the commit-log record and the consume-queue entry.

:mod:`.record` and :mod:`.consumequeue` pack and unpack with the structs built here; the compiled
kernels (``_appender.c``, ``_scan.c``) include ``_layout.h``, generated from :data:`CONSTANTS` by
``python scripts/kernel_headers.py`` (tests/test_kernel_layouts.py fails when it is stale). Each kernel exports the ``LAYOUT_VERSION`` it was compiled with; :mod:`.appender` and
:mod:`.scan` use a kernel only when it equals :data:`LAYOUT_VERSION` (see :mod:`plugmq.kit.native`).
The field table is in :mod:`.record`'s docstring.
"""

from __future__ import annotations

import struct
from pathlib import Path

from plugmq.kit.native import Kernel, c_header, layout_version, struct_offsets

__all__ = ["APPEND_KERNEL", "BLANK", "CONSTANTS", "CQ_ENTRY", "HEAD", "HEADER_PATH", "LAYOUT_VERSION", "RECORD_FIELDS",
           "SCAN_KERNEL", "header_text"]

#: Bumped by hand when the meaning of the bytes changes without any constant below changing.
FORMAT_VERSION = 1

#: The record header, field by field (``struct`` codes, big-endian); the body and the tail follow it.
RECORD_FIELDS = (
    ("TOTAL", "i"), ("MAGIC", "I"), ("RECORD_CRC", "I"), ("BODY_CRC", "I"), ("QUEUE_ID", "i"), ("FLAG", "i"),
    ("QUEUE_OFFSET", "q"), ("PHYS", "q"), ("SYS_FLAG", "i"), ("BORN_TS", "q"), ("BORN_HOST", "8s"),
    ("STORE_TS", "q"), ("STORE_HOST", "8s"), ("RECONSUME", "i"), ("PREPARED", "q"), ("TAGS_CODE", "q"),
    ("BODY_LEN", "i"),
)
#: A consume-queue entry: commit-log offset, record size, tags code.
CQ_FIELDS = (("PHYS", "q"), ("SIZE", "i"), ("TAGS", "q"))

HEAD = struct.Struct(">" + "".join(code for _, code in RECORD_FIELDS))
CQ_ENTRY = struct.Struct(">" + "".join(code for _, code in CQ_FIELDS))
BLANK = struct.Struct(">iI")  # the end-of-segment marker: total size (to the segment's end), BLANK_MAGIC
_OFFSETS = struct_offsets(RECORD_FIELDS, "OFF_")

CONSTANTS: dict[str, int] = {
    "FORMAT_VERSION": FORMAT_VERSION,
    # RocketMQ's V1 magic is 0xDAA320A7; this layout differs, so the magic does too
    "MESSAGE_MAGIC": 0xDAA320B7,
    "BLANK_MAGIC": 0xCBD43194,  # RocketMQ's BLANK_MAGIC_CODE: the end-of-segment filler
    "END_FILE_MIN_BLANK": BLANK.size,  # a segment always keeps room for a blank marker after its last record
    "BLANK_SIZE": BLANK.size,
    "HEADER_SIZE": HEAD.size,
    **_OFFSETS,
    "RECORD_CRC_FROM": _OFFSETS["OFF_BODY_CRC"],  # the record CRC covers [this, HEADER_SIZE) after the tail
    "TOPIC_LEN_SIZE": 1,  # the tail: topic length, topic, properties length, properties
    "PROPS_LEN_SIZE": 2,
    "MAX_TOPIC_BYTES": 255,
    "MAX_PROPERTIES_BYTES": 0xFFFF,
    "MIN_RECORD": HEAD.size + 1 + 2 + 1,
    "FLAG_BORN_HOST_IN_PROPS": 0x1,  # bit of FLAG: the born host is not IPv4 and travels in a property
    "CQ_ENTRY_SIZE": CQ_ENTRY.size,
    **struct_offsets(CQ_FIELDS, "CQ_OFF_"),
}
LAYOUT_VERSION = layout_version(CONSTANTS)
HEADER_PATH = Path(__file__).with_name("_layout.h")

APPEND_KERNEL = Kernel(
    module="plugmq.plugins.store_mmap._appender",
    layout_version=LAYOUT_VERSION,
    users=("store_mmap",),
    fallback="appends run through appender.PyAppender (the same bytes)",
    cost="an append takes about 4x the CPU (128 B, single appends)",
    functions=("Appender.append_columns", "Appender.direct_capsule"),
)
SCAN_KERNEL = Kernel(
    module="plugmq.plugins.store_mmap._scan",
    layout_version=LAYOUT_VERSION,
    users=("store_mmap",),
    fallback="opening a store checks records and bulk reads decode them with scan.PyScanKernel (the same result)",
    cost="recovery checks a record with about 13x the CPU",
    functions=("scan", "check_entries", "read_records", "read_run", "queue_entries"),
)


def header_text() -> str:
    return c_header("PLUGMQ_STORE_MMAP_LAYOUT_H", "plugmq/plugins/store_mmap/layout.py", CONSTANTS)

