"""The layouts delay_schedule's compiled kernel reads and writes, written once: the schedule-log
record (header and trailer) and the dispatch-log record.

:mod:`.records` and :mod:`.dispatch_log` pack and unpack with the structs built here;
``_segscan.c`` includes ``_segscan_layout.h``, generated from :data:`CONSTANTS` by
``python scripts/kernel_headers.py`` (tests/test_kernel_layouts.py fails when it is stale), and
exports the ``LAYOUT_VERSION`` it was compiled with: the Python side uses it only when it equals
:data:`LAYOUT_VERSION` (see :mod:`plugmq.kit.native`). The field meanings are in :mod:`.records`.
"""

from __future__ import annotations

import struct
from pathlib import Path

from plugmq.kit.native import Kernel, c_header, layout_version, struct_offsets

__all__ = ["CONSTANTS", "DISPATCH", "DISPATCH_CRC_PART", "HEADER_PATH", "LAYOUT_VERSION", "MAX_RECORD", "SCH_HEAD",
           "SCH_MAGIC", "SCH_TAIL", "SEGSCAN", "header_text"]

#: Bumped by hand when the meaning of the bytes changes without any constant below changing.
FORMAT_VERSION = 1

SCH_MAGIC = 0x51534331  # "QSC1"
SCH_FIELDS = (("MAGIC", "I"), ("SIZE", "I"), ("CRC", "I"), ("STORE_TS", "q"), ("SCHEDULE_TIME", "q"), ("SEQ", "q"),
              ("SOURCE", "q"), ("INDEX", "I"), ("DELAY_LEVEL", "i"))
SCH_TAIL_FIELDS = (("SIZE", "I"), ("MAGIC", "I"))  # the trailer repeats size and magic
SCH_HEAD = struct.Struct(">" + "".join(code for _, code in SCH_FIELDS))
SCH_TAIL = struct.Struct(">" + "".join(code for _, code in SCH_TAIL_FIELDS))
# A record longer than this is garbage (a torn length field), not a message.
MAX_RECORD = 64 << 20

#: A dispatch-log record: kind, 3 pad bytes, CRC-32 of DISPATCH_CRC_PART (kind, sequence), sequence.
DISPATCH = struct.Struct(">B3xIq")
DISPATCH_CRC_PART = struct.Struct(">Bq")

CONSTANTS: dict[str, int] = {
    "FORMAT_VERSION": FORMAT_VERSION,
    "SCH_MAGIC": SCH_MAGIC,
    "SCH_HEAD_SIZE": SCH_HEAD.size,
    **struct_offsets(SCH_FIELDS, "SCH_OFF_"),
    "SCH_CRC_FROM": struct_offsets(SCH_FIELDS)["STORE_TS"],  # the CRC covers [this, size - trailer)
    "SCH_TAIL_SIZE": SCH_TAIL.size,
    **struct_offsets(SCH_TAIL_FIELDS, "SCH_TAIL_OFF_"),
    "SCH_MAX_RECORD": MAX_RECORD,
    "DISPATCH_SIZE": DISPATCH.size,
    "DISPATCH_OFF_KIND": 0,
    "DISPATCH_OFF_CRC": 4,
    "DISPATCH_OFF_SEQ": 8,
    "DISPATCH_CRC_PART_SIZE": DISPATCH_CRC_PART.size,
}
LAYOUT_VERSION = layout_version(CONSTANTS)
HEADER_PATH = Path(__file__).with_name("_segscan_layout.h")

SEGSCAN = Kernel(
    module="plugmq.plugins.delay_schedule._segscan",
    layout_version=LAYOUT_VERSION,
    users=("delay_schedule",),
    fallback="segments are loaded and dispatch records encoded by the Python loops of schedule_log.py and "
             "dispatch_log.py",
    cost="loading a segment takes about 6x the CPU, encoding dispatch records 13x",
)


def header_text() -> str:
    return c_header("PLUGMQ_DELAY_SCHEDULE_LAYOUT_H", "plugmq/plugins/delay_schedule/layout.py", CONSTANTS)
