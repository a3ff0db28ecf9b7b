"""delay_level: RocketMQ 4.x fixed delay levels (seed 003), with restarts that duplicate nothing.

A level request is stored *in the broker's store* with its topic rewritten to
``SCHEDULE_TOPIC_XXXX``, queue id = level - 1, the real topic/queue in REAL_TOPIC / REAL_QID and
the deliver timestamp (ms) in the consume queue's tag field. One timer per level reads its queue
head in order and writes due messages back to their real topic (delay properties removed, tag
field recomputed from TAGS). Levels: ``levels`` option (RocketMQ's default 18, 1s .. 2h); a level
above the last is clamped (``clamp_to_max_delay``, RocketMQ's rule) or refused. A level's timer
fires at its head's deliver time (``tick_ms`` 1: to the millisecond); due messages go back in
batches of ``dispatch_batch`` (one ``deliver_batch`` each).

Beyond RocketMQ: per-level offsets (``<data dir>/delay_level/offsets.bin``, two checksummed
slots written alternately) are persisted after every delivery batch and at close, not every
10 s; when the scheduler opens, the entries a killed process may have written back after its last
persist are checked against the store with ``was_delivered``, so nothing is delivered twice.
``start()`` returns at once; what came due while down is delivered by a catch-up timer, oldest
first across levels, and counted in ``metrics()``
(``overdue_at_start``, ``late_at_start_ms_max``). With ``dead_letter_older_than_ms`` > 0, overdue messages older than
that go to ``dead_letter_topic`` (default ``%DLQ%DELAY_LEVEL``, queue 0, REAL_TOPIC / REAL_QID
naming where they were going) instead.

Refused: arbitrary delays (a deliver-at time) and cancel — levels cannot express either; use
delay_wheel or delay_schedule.
"""

from __future__ import annotations

from plugmq.core import DelayContext, Family, PluginDeclaration, hookimpl
from plugmq.kit.options import options_or_default
from plugmq.plugins.delay_level.options import DelayLevelOptions
from plugmq.plugins.delay_level.scheduler import (
    NAME,
    LevelDelayScheduler,
    capabilities_for,
)

__all__ = ["DelayLevelOptions", "LevelDelayScheduler", "plugmq_declare", "plugmq_make_delay_scheduler"]


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.DELAY},
        description="RocketMQ fixed delay levels: SCHEDULE_TOPIC_XXXX queue per level, one timer per level",
        options=DelayLevelOptions,
        capabilities=capabilities_for(DelayLevelOptions()),
    )


@hookimpl
def plugmq_make_delay_scheduler(context: DelayContext) -> LevelDelayScheduler:
    return LevelDelayScheduler(context, options_or_default(context, NAME, DelayLevelOptions))
