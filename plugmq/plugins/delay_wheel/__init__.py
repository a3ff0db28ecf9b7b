"""delay_wheel: arbitrary delays on seed 000's hour / second timing wheel plus a millisecond level.

Files, under ``<data dir>/delay_wheel/``:

- ``hours/<hour>.log``  delay log of one deliver-time hour (hour = epoch seconds // 3600):
  full AppendRequest records, appended in arrival order;
- ``hours/<hour>.idx``  delay index, 32-byte entries ``{offset, size, localIndex, globalIndex,
  preGlobalIndex, second, ms}``;
- ``hours/<hour>.head`` the 3600 heads (last globalIndex and count of each second, 16 bytes each),
  so a second's messages are found by walking preGlobalIndex backwards: insert and load are
  O(1), nothing is sorted, and memory does not grow with the backlog;
- ``hours/<hour>.cancel`` globalIndexes cancelled in that hour;
- ``wheel.ckpt``        the position (due ms + localIndex) and the batch in flight (checkpoint.py).

Files exist only for hours that hold messages; the nearest two are mmap'ed, the rest are written
with positional writes and cost no memory. The second being dispatched is sorted by its
entries' milliseconds (the millisecond level), so a message is written back at its deliver
time (resolution 1 ms), in batches of ``dispatch_batch`` (one ``deliver_batch`` and one
checkpoint pair each). An hour's files are removed by ``clean_expired`` once the position has
passed it (every entry delivered or cancelled) and the hour is over.

Message id (what ``schedule`` returns and ``cancel`` takes): ``encode_msg_id(store_host,
hour * 2**32 + globalIndex)``.

Durability: ``fsync`` off by default (kill -9 safe, not power-cut safe), like every delay plugin.
``start()`` returns at once; an overdue backlog goes out on the clock's thread.

Dead letters: with ``dead_letter_older_than_ms`` > 0, a message found overdue at ``start()`` by
more than that goes to ``dead_letter_topic`` (default ``%DLQ%DELAY``, queue 0, REAL_TOPIC and
REAL_QID set to where it was going) instead of its own topic; it counts as ``dead_lettered``.
"""

from __future__ import annotations

from plugmq.core import DelayContext, Family, PluginDeclaration, hookimpl
from plugmq.plugins.delay_wheel.options import DelayWheelOptions
from plugmq.plugins.delay_wheel.scheduler import WheelDelayScheduler, capabilities_for

__all__ = ["DelayWheelOptions", "WheelDelayScheduler", "plugmq_declare", "plugmq_make_delay_scheduler"]

NAME = "delay_wheel"


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.DELAY},
        description="Arbitrary delay: hourly delay logs + chained delay index, hour/second wheel + millisecond level",
        options=DelayWheelOptions,
        capabilities=capabilities_for(DelayWheelOptions()),
    )


@hookimpl
def plugmq_make_delay_scheduler(context: DelayContext) -> WheelDelayScheduler:
    options = context.options_for(NAME) or DelayWheelOptions()
    return WheelDelayScheduler(context, options)
