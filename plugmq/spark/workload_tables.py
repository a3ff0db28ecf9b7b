"""The ``[workloads.<name>]`` tables of an experiments file: what is sent and received.

Each table (and its ``delay``, ``filter``, ``churn``, ``serve`` and ``chaos`` sub-tables) is an attrs schema the
configuration engine (:mod:`plugmq.core.schema`) checks: a doc and validators per key, the rules
between keys in ``__attrs_post_init__`` (a :class:`Refusal` naming the key it blames).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

import attrs

from plugmq.core.schema import (
    Expect,
    Refusal,
    above,
    at_least,
    at_most,
    converter,
    internal,
    non_empty,
    one_of,
    setting,
)

__all__ = ["CHAOS_MODES", "CLOCKS", "FLUSH_MODES", "ChaosSpec", "Churn", "DelayMix", "FilterSpec", "FilterTable", "Finite", "ServeSpec",
           "Weight", "Workload"]

CLOCKS = ("virtual", "real")
CHAOS_MODES = ("sync", "async")
FLUSH_MODES = ("sync", "async")
Finite = Annotated[float, Expect("a finite number", math.isfinite)]
Weight = Annotated[float, Expect("a weight >= 0", lambda w: math.isfinite(w) and w >= 0)]
_LEVEL = Annotated[int, Expect("a delay level >= 1", lambda level: level >= 1)]


@attrs.frozen
class DelayMix:
    """Which messages are delayed and by how much (``[workloads.<name>.delay]``).

    ``levels``: RocketMQ delay levels, sent as ``delay_level`` (every strategy can express them).
    ``distribution``: "uniform" or "exponential" delays in [min_delay_s, max_delay_s], sent as a
    deliver-at time (a level-only strategy must refuse them: the experiment reports "unsupported").
    ``burst_ms`` (deliver-at times only): each deliver-at time is rounded up to the next multiple of
    ``burst_ms`` of the clock, so every message drawn for one window falls due at the same instant
    (a burst the strategy must fire at once). 0: no rounding.
    """

    fraction: Finite = setting(0.0, doc="the share of messages sent delayed",
                               validator=[at_least(0.0), at_most(1.0)])
    levels: tuple[_LEVEL, ...] | None = setting(
        None, doc="RocketMQ delay levels to draw from (or give distribution)",
        validator=attrs.validators.optional(non_empty("give at least one delay level, e.g. [1, 2, 3]")))
    distribution: str | None = setting(None, doc="uniform or exponential deliver-at delays (or give levels)",
                                       validator=attrs.validators.optional(one_of("uniform", "exponential")))
    min_delay_s: Finite = setting(1.0, doc="shortest drawn delay", validator=at_least(0.0))
    max_delay_s: Finite = setting(0.0, doc="longest drawn delay (above min_delay_s)", validator=at_least(0.0))
    mean_delay_s: Finite = setting(0.0, doc="mean of an exponential distribution", validator=at_least(0.0))
    burst_ms: int = setting(0, doc="round deliver-at times up to a multiple of this (0: no bursts)",
                            validator=at_least(0))

    def __attrs_post_init__(self) -> None:
        if (self.levels is None) == (self.distribution is None):
            raise Refusal("give exactly one of 'levels' (a list of RocketMQ delay levels) or 'distribution' "
                          "(\"uniform\" or \"exponential\" with max_delay_s)", colon=True)
        if self.distribution is not None and self.max_delay_s <= self.min_delay_s:
            raise Refusal(f"must be above min_delay_s ({self.min_delay_s}) for a {self.distribution} distribution, "
                          f"got {self.max_delay_s}", key="max_delay_s")
        if self.distribution == "exponential" and self.mean_delay_s <= 0:
            raise Refusal("must be > 0 for an exponential distribution", key="mean_delay_s")
        if self.burst_ms and self.distribution is None:
            raise Refusal("bursts round deliver-at times; a level delay is relative to the send and cannot be "
                          "aligned (use a distribution, or remove burst_ms)", key="burst_ms", colon=True)

    @property
    def arbitrary(self) -> bool:
        return self.distribution is not None


def _weights_sum(_inst: object, _attr: object, weights: Mapping[str, float] | None) -> None:
    if weights is not None and sum(weights.values()) <= 0:
        raise Refusal("has weights that sum to 0; give at least one value a positive weight", colon=False)


def _check_properties(_inst: object, _attr: object, properties: Mapping[str, Mapping[str, Any]] | None) -> None:
    for name, spec in (properties or {}).items():
        if set(spec) == {"uniform_int"}:
            bounds = spec["uniform_int"]
            if not (isinstance(bounds, list) and len(bounds) == 2 and all(type(b) is int for b in bounds)
                    and bounds[0] < bounds[1]):
                raise Refusal(f"must be [low, high) integers with low < high, got {bounds!r}", key=f"{name}.uniform_int")
        elif not spec or not all(type(w) in (int, float) and math.isfinite(w) and w >= 0 for w in spec.values()):
            raise Refusal("must be a non-empty table of value = weight (weights >= 0), or { uniform_int = [low, high] }",
                          key=name)
        elif sum(spec.values()) <= 0:
            raise Refusal("has weights that sum to 0; give at least one value a positive weight", key=name)


@attrs.frozen
class FilterSpec:
    """The subscription expression and the tag / property distribution it is run against.

    ``tags``: (tag, weight) pairs; ``properties``: (name, ((value, weight), ...)) pairs; a
    ``uniform_int`` property draws an integer in [low, high). With ``selectivity`` alone, both the
    distribution and the expression are generated so that this fraction of messages matches.
    """

    type: str
    expression: str
    tags: tuple[tuple[str, float], ...] = ()
    properties: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    uniform_ints: tuple[tuple[str, int, int], ...] = ()
    selectivity: float | None = None


@attrs.frozen
class FilterTable:
    """``[workloads.<name>.filter]``: a subscription and the messages it is run against."""

    type: str = setting(doc='"TAG" or "SQL92"', validator=one_of("TAG", "SQL92"))
    expression: str | None = setting(None, doc="the subscription expression (unless selectivity is given)")
    selectivity: Finite | None = setting(
        None, doc="alone: the share of messages that match (expression and distribution are generated)",
        validator=attrs.validators.optional([at_least(0.0), at_most(1.0)]))
    tags: Mapping[str, Weight] | None = setting(None, doc="tag = weight: how often each tag is sent",
                                                expected="a table of value = weight", validator=_weights_sum)
    properties: Mapping[str, Mapping[str, Any]] | None = setting(
        None, doc="name = { value = weight, ... } or name = { uniform_int = [low, high] }",
        expected="a table: name = { value = weight, ... }", validator=_check_properties)

    def __attrs_post_init__(self) -> None:
        if self.selectivity is not None and (self.expression or self.tags or self.properties):
            raise Refusal("give either 'selectivity' alone (distribution and expression are generated) or "
                          "'expression' with 'tags' / 'properties', not both", colon=True)
        if self.selectivity is None and not self.expression:
            raise Refusal("is required unless 'selectivity' is given", key="expression")
        if self.type == "TAG" and self.selectivity is None and not self.tags:
            raise Refusal("is required for a TAG filter with an explicit expression", key="tags")

    def spec(self) -> FilterSpec:
        """The filter this table describes (generated from the selectivity when it gives one)."""
        if self.selectivity is not None:
            if self.type == "TAG":
                rest = (1.0 - self.selectivity) / 4
                tags = (("Match", self.selectivity), *((f"Other{i}", rest) for i in range(4)))
                return FilterSpec("TAG", "Match", tags=tuple((k, w) for k, w in tags if w > 0),
                                  selectivity=self.selectivity)
            bound = round(self.selectivity * 10_000)
            return FilterSpec("SQL92", f"score < {bound}", uniform_ints=(("score", 0, 10_000),),
                              selectivity=bound / 10_000)
        properties = {name: spec for name, spec in (self.properties or {}).items() if set(spec) != {"uniform_int"}}
        uniform = tuple((name, *spec["uniform_int"]) for name, spec in (self.properties or {}).items()
                        if set(spec) == {"uniform_int"})
        return FilterSpec(self.type, self.expression or "", tuple((str(k), float(w)) for k, w in (self.tags or {}).items()),
                          tuple((name, tuple((str(v), float(w)) for v, w in spec.items()))
                                for name, spec in properties.items()), uniform, None)


def _filter_spec(value: Any) -> FilterSpec | None:
    """A workload's ``filter`` table as the FilterSpec it describes (a FilterSpec passes as it is)."""
    if value is None or isinstance(value, FilterSpec):
        return value
    return converter.structure(value, FilterTable).spec()


@attrs.frozen
class Churn:
    """``[workloads.<name>.churn]``: consumers joining and leaving (replayed on the virtual clock)."""

    joins_per_minute: Finite = setting(0.0, doc="consumers joining per minute", validator=at_least(0.0))
    leaves_per_minute: Finite = setting(0.0, doc="consumers leaving per minute", validator=at_least(0.0))
    min_consumers: int = setting(1, doc="leaves stop at this many consumers", validator=at_least(1))


@attrs.frozen
class ServeSpec:
    """A served workload: the broker runs behind ``plugmq serve`` in a child process and the
    official Python client drives it. Producers (``producers_per_topic`` per topic, one client
    Producer each) send from the experiment's process; the consumers (``consumers_per_subscription``
    SimpleConsumer threads per subscription) receive ``receive_batch`` messages at a time and ack
    each one, from a process of their own, as separate applications would."""

    receive_batch: int = setting(16, doc="messages per receive", validator=at_least(1))
    invisible_s: int = setting(30, doc="invisible duration of a received message", validator=at_least(1))
    long_polling_s: int = setting(1, doc="a receive waits this long for messages", validator=at_least(1))
    request_timeout_s: int = setting(10, doc="the client's request timeout (whole seconds)",
                                     validator=at_least(1))


def _known_faults(_inst: object, _attr: object, faults: tuple[str, ...]) -> None:
    from plugmq.chaos.faults import FAULTS

    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise Refusal(f"has unknown fault {unknown[0]!r}; plugmq chaos knows {', '.join(FAULTS)}")
    if not faults:
        raise Refusal("must name at least one fault")


@attrs.frozen
class ChaosSpec:
    """A ``plugmq chaos`` schedule run against each plugin set (``kind = "chaos"``): a failover
    cluster of ``brokers`` brokers on a ZooKeeper of its own, each fault of ``faults`` injected
    ``rounds`` times under load, then every acknowledged message checked. The load is the
    workload's: ``producers_per_topic`` producer threads, ``subscriptions_per_topic`` groups of
    ``consumers_per_subscription`` consumers, ``message_size`` bytes a body."""

    faults: tuple[str, ...] = setting(("kill-master",), doc="plugmq chaos fault names, each run `rounds` times",
                                      validator=_known_faults)
    rounds: int = setting(1, doc="injections of each fault", validator=at_least(1))
    mode: str = setting("sync", doc="the master's replication mode (sync or async), unless the plugin set "
                                    "replicates with a broker.role of its own", validator=one_of(*CHAOS_MODES))
    brokers: int = setting(2, doc="brokers of the failover cluster (a master and its slaves)", validator=at_least(2))
    session_timeout_s: Finite = setting(2.0, doc="ZooKeeper session timeout: how soon a dead master is noticed",
                                        validator=at_least(1.0))
    steady_s: Finite = setting(3.0, doc="load before each fault and after the last heal", validator=at_least(0.0))
    recover_s: Finite = setting(60.0, doc="longest wait for the cluster and the clients to recover after a heal",
                                validator=above(0.0))


def _default_clock(workload: Workload) -> str:
    return "virtual" if (workload.delay is not None or workload.churn is not None) else "real"


@attrs.frozen(kw_only=True)
class Workload:
    """``[workloads.<name>]``: what is sent and received (OpenMessaging Benchmark vocabulary plus broker
    extensions)."""

    name: str = internal("", doc="the table's name")
    topics: int = setting(1, doc="topics", validator=at_least(1))
    queues_per_topic: int = setting(4, doc="queues of each topic", validator=at_least(1))
    message_size: int = setting(128, doc="body bytes", validator=at_least(16))
    producers_per_topic: int = setting(1, doc="producers of each topic", validator=at_least(1))
    producer_rate: Finite = setting(0.0, doc="msg/s per producer; 0 = as fast as possible (real clock only)",
                                    validator=at_least(0.0))
    subscriptions_per_topic: int = setting(1, doc="consumer groups of each topic", validator=at_least(0))
    consumers_per_subscription: int = setting(1, doc="consumers of each group", validator=at_least(1))
    warmup_s: Finite = setting(0.0, doc="sent before measuring", validator=at_least(0.0))
    duration_s: Finite = setting(10.0, doc="measured sending time", validator=above(0.0))
    backlog_messages: int = setting(0, doc="messages stored before consumers start", validator=at_least(0))
    seed: int = setting(0, doc="the workload's random seed")
    batch_size: int = setting(1, doc="messages per send", validator=at_least(1))
    flush: str | None = setting(None, doc="overrides the store's flush for this workload",
                                validator=attrs.validators.optional(one_of(*FLUSH_MODES)))
    delay: DelayMix | None = setting(None, doc="delayed messages")
    filter: FilterSpec | None = attrs.field(default=None, converter=_filter_spec, metadata={
        "doc": "a filtered subscription", "schema": FilterTable, "expected": "a table"})
    churn: Churn | None = setting(None, doc="consumers joining and leaving")
    serve: ServeSpec | None = setting(None, doc="through plugmq serve and the official Python client (real clock)")
    chaos: ChaosSpec | None = setting(None, doc="a plugmq chaos schedule per plugin set (kind = \"chaos\")")
    clock: str = attrs.field(default=attrs.Factory(_default_clock, takes_self=True), validator=one_of(*CLOCKS),
                             metadata={"doc": '"virtual" (ManualClock) or "real"; default virtual with delay or churn'})
    step_ms: int = setting(1000, doc="virtual-clock step", validator=at_least(1))
    drain_s: Finite = setting(0.0, doc="real clock: how long to wait for delayed messages after sending stops",
                              validator=at_least(0.0))

    def __attrs_post_init__(self) -> None:
        refusal = self._served_refusal() if self.serve is not None else None
        refusal = refusal or (self._chaos_refusal() if self.chaos is not None else None)
        refusal = refusal or self._timing_refusal()
        if refusal is not None:
            raise refusal

    def _served_refusal(self) -> Refusal | None:
        """What a served workload cannot do (yet): say so instead of measuring something else."""
        if self.clock != "real":
            return Refusal("a served workload runs on the real clock (plugmq serve in a child process); remove "
                           "clock = \"virtual\"", key="serve", colon=True)
        if self.batch_size != 1:
            return Refusal("the official Python client sends one message per SendMessage; use batch_size = 1 "
                           "with serve", key="batch_size", colon=True)
        for key, used in (("delay", self.delay is not None and self.delay.fraction > 0),
                          ("filter", self.filter is not None), ("churn", self.churn is not None)):
            if used:
                return Refusal(f"not measured through plugmq serve; compare {key} on an embedded broker (a "
                               "workload without serve)", key=key, colon=True)
        return None

    def _chaos_refusal(self) -> Refusal | None:
        """A chaos schedule drives brokers in child processes with the official client."""
        if self.serve is not None:
            return Refusal("a workload is served or a chaos schedule, not both", key="chaos", colon=True)
        if self.clock != "real":
            return Refusal("a chaos schedule runs on the real clock (brokers in child processes); remove "
                           "clock = \"virtual\"", key="chaos", colon=True)
        for key, used in (("delay", self.delay is not None and self.delay.fraction > 0),
                          ("filter", self.filter is not None), ("churn", self.churn is not None),
                          ("topics", self.topics != 1)):
            if used:
                return Refusal(f"not measured under a chaos schedule (one topic, plain messages); compare {key} "
                               "in a workload without chaos", key=key, colon=True)
        return None

    def _timing_refusal(self) -> Refusal | None:
        delayed = self.delay is not None and self.delay.fraction > 0
        if self.clock == "virtual" and self.producer_rate <= 0:
            return Refusal("a virtual-clock workload needs a rate > 0 (\"as fast as possible\" has no meaning in "
                           "virtual time); set clock = \"real\" or a rate", key="producer_rate", colon=True)
        if delayed and self.batch_size > 1:
            return Refusal("delayed messages cannot be batched (RocketMQ rule); use batch_size = 1 with a delay mix",
                           key="batch_size", colon=True)
        if self.delay is not None and self.delay.burst_ms and self.producer_rate <= 0:
            return Refusal("a burst workload (delay.burst_ms) needs a fixed rate, so every strategy fires bursts of "
                           "the same size (as fast as possible, a slower send makes smaller bursts)",
                           key="producer_rate", colon=True)
        if self.churn is not None and self.clock != "virtual":
            return Refusal("consumer churn is replayed on the virtual clock; set clock = \"virtual\"", key="churn",
                           colon=True)
        if self.churn is not None and self.subscriptions_per_topic < 1:
            return Refusal("churn needs at least one subscription (subscriptions_per_topic >= 1)", key="churn",
                           colon=True)
        if self.clock == "real" and delayed and self.drain_s <= 0:
            assert self.delay is not None
            longest = max(self.delay.levels) if self.delay.levels else self.delay.max_delay_s
            return Refusal("a real-clock workload with delayed messages must say how long to wait for them after "
                           f"producing stops (drain_s); the longest delay is {longest}"
                           f"{' (level)' if self.delay.levels else ' s'}", key="drain_s", colon=True)
        return None


