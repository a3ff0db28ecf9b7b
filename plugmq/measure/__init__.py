"""The measurement driver ``plugmq bench`` and ``plugmq compare`` (Spark) share.

* :mod:`plugmq.kit.histogram` - the one latency histogram and the one quantile definition
  (nearest rank on fixed log-spaced buckets, 40 per decade, at most ~6 % above the true value and
  never below it); it lives in the kit because the delay plugins' ``metrics()`` report with it too;
* :mod:`.probes` - CPU time and resident memory of this process and of children, bytes on disk,
  the load average around a run, where a run ran;
* :mod:`.pacing` - producers on a rate: the k-th send at a fixed slot of the clock, not after
  the previous send plus a pause;
* :mod:`.threads` - workers on threads whose first error is raised in the caller;
* :mod:`.children` - brokers in child processes (``plugmq serve`` on a free loopback port);
* :mod:`.clients` - the official RocketMQ Python client's producers and messages;
* :mod:`.consumers` - receive + ack consumers in a process of their own.

It imports the runtime, the kit and the SPI, never ``plugmq.bench`` or ``plugmq.spark`` (a
contract in pyproject.toml), and neither of those imports the other.
"""

from __future__ import annotations

from plugmq.core.errors import PlugmqError

__all__ = ["MeasureError"]


class MeasureError(PlugmqError):
    """A measurement could not be taken: a child did not start, a worker failed, a load did not finish."""
