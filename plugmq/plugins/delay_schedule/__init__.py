"""``delay_schedule``: QMQ's delay server (seed 001) as a plugmq delay strategy.

Message log (WAL) -> iterator with a checkpoint -> schedule-log segments per deliver-time bucket
-> hashed wheel loaded ahead of each bucket -> write-back, with a dispatch log per segment that
makes restarts (clean or ``kill -9``) lose nothing and deliver nothing twice, persisted cancel,
and retention driven by the dispatch log instead of by age. See ``scheduler`` for the flow.

Capabilities: cancel, arbitrary delays up to ``max_delay_ms`` (default two years, QMQ's design
limit), resolution = ``tick_ms`` (default 1 ms; QMQ's wheel ticks every 500 ms). ``plugmq_declare``
states the defaults; a scheduler built with other options carries its own ``capabilities``.
Durability: ``fsync`` off by default (kill -9 safe, not power-cut safe), like the other delay
plugins; ``clean_expired`` is the retention the broker's timer calls.
"""

from __future__ import annotations

from plugmq.core import (
    DelayContext,
    DelayScheduler,
    Family,
    PluginDeclaration,
    hookimpl,
)
from plugmq.plugins.delay_schedule.options import DelayScheduleOptions
from plugmq.plugins.delay_schedule.scheduler import (
    PLUGIN_NAME,
    ScheduleDelayScheduler,
    capabilities_for,
)

__all__ = ["DelayScheduleOptions", "ScheduleDelayScheduler", "plugmq_declare", "plugmq_make_delay_scheduler"]


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=PLUGIN_NAME,
        families={Family.DELAY},
        description="QMQ delay server: message log -> schedule-log buckets -> hashed wheel, dispatch log, cancel",
        options=DelayScheduleOptions,
        capabilities=capabilities_for(DelayScheduleOptions()),
    )


@hookimpl
def plugmq_make_delay_scheduler(context: DelayContext) -> DelayScheduler | None:
    options = context.options_for(PLUGIN_NAME)
    if options is None:
        options = DelayScheduleOptions()
    elif not isinstance(options, DelayScheduleOptions):
        options = DelayScheduleOptions(**dict(options))
    return ScheduleDelayScheduler(context, options)
