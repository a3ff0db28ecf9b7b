"""What a workload sends and when: a deterministic plan drawn from the workload's seed.

The plan is the same for every plugin set, so a comparison sees identical traffic: the same
message sizes, tags, properties, delays and churn events, in the same order.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator

import attrs

from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.message import Message
from plugmq.spark.experiments import Churn, DelayMix, Workload

__all__ = ["ChurnEvent", "MessageFactory", "SendEvent", "churn_events", "send_events", "topic_names"]

# Properties the replay adds to every message (kept short: they are stored with each message).
SEQ = "bseq"  # "<topic index>:<sequence>": identifies a message across the run
DUE = "bdue"  # intended deliver time of a delayed message, epoch ms
WARM = "bwarm"  # present on warm-up messages (excluded from the statistics)


def topic_names(workload: Workload) -> list[str]:
    return [f"{workload.name}_t{i}" for i in range(workload.topics)]


@attrs.frozen
class SendEvent:
    """At ``at_s`` (seconds after the start), producer ``producer`` of topic ``topic`` sends
    ``count`` messages (one send, or one batch)."""

    at_s: float
    topic: int
    producer: int
    count: int


@attrs.frozen
class ChurnEvent:
    at_s: float
    action: str  # "join" | "leave"


def send_events(workload: Workload) -> Iterator[SendEvent]:
    """Every send of the timeline (warm-up then measurement), in time order.

    Producer p of a topic sends at rate/batch_size events per second, offset by p / producers of
    one period so that producers interleave rather than fire together.
    """
    period = workload.batch_size / workload.producer_rate
    horizon = workload.warmup_s + workload.duration_s
    streams = []
    for t in range(workload.topics):
        for p in range(workload.producers_per_topic):
            offset = period * (p / workload.producers_per_topic + t / (workload.topics * workload.producers_per_topic))
            streams.append(_stream(t, p, offset, period, horizon, workload.batch_size))
    yield from heapq.merge(*streams, key=lambda e: (e.at_s, e.topic, e.producer))


def _stream(topic: int, producer: int, offset: float, period: float, horizon: float, batch: int) -> Iterator[SendEvent]:
    k = 0
    while True:
        at = offset + k * period
        if at >= horizon:
            return
        yield SendEvent(at, topic, producer, batch)
        k += 1


def churn_events(churn: Churn | None, workload: Workload, seed: int) -> list[ChurnEvent]:
    """Joins and leaves spread over the measured period, each at a seeded random time."""
    if churn is None:
        return []
    rng = random.Random(f"churn-{seed}")
    start, length = workload.warmup_s, workload.duration_s
    events = []
    for action, per_minute in (("join", churn.joins_per_minute), ("leave", churn.leaves_per_minute)):
        count = round(per_minute * length / 60)
        for i in range(count):
            # One event per equal slice, jittered inside it: spread out, yet not periodic.
            events.append(ChurnEvent(start + (i + rng.random()) * length / count, action))
    return sorted(events, key=lambda e: (e.at_s, e.action))


class MessageFactory:
    """Draws one producer's messages (tags, properties, delay) from the workload's distributions.

    Each (topic, producer) stream has its own generator, so what a producer sends does not depend
    on how producer threads interleave.
    """

    def __init__(self, workload: Workload, seed: int, topic: int, stream: str,
                 levels_ms: tuple[int, ...] | None = None) -> None:
        self.workload = workload
        self.topic = topic_names(workload)[topic]
        self.stream = stream
        self.rng = random.Random(f"messages-{seed}-{stream}")
        self.levels_ms = levels_ms or DEFAULT_DELAY_LEVELS_MS
        self.payload = random.Random(f"payload-{seed}").randbytes(workload.message_size)
        self.sequence = 0
        flt = workload.filter
        self._tags = _chooser(flt.tags) if flt and flt.tags else None
        self._props = [(name, _chooser(values)) for name, values in flt.properties] if flt else []
        self._ints = list(flt.uniform_ints) if flt else []

    def next(self, now_ms: int, *, warmup: bool = False, header: bytes = b"") -> Message:
        """The next message; ``now_ms`` (the broker clock at send) fixes the intended deliver time
        of a delayed one; ``header`` (e.g. a send timestamp) replaces the start of the payload."""
        rng = self.rng
        props = {SEQ: f"{self.stream}:{self.sequence}"}
        self.sequence += 1
        if warmup:
            props[WARM] = "1"
        tags = self._tags(rng) if self._tags else None
        for name, choose in self._props:
            props[name] = choose(rng)
        for name, low, high in self._ints:
            props[name] = str(rng.randrange(low, high))
        delay = self.workload.delay
        level = deliver_at = None
        if delay is not None and delay.fraction > 0 and rng.random() < delay.fraction:
            if delay.levels is not None:
                level = rng.choice(delay.levels)
                props[DUE] = str(now_ms + self.levels_ms[min(level, len(self.levels_ms)) - 1])
            else:
                deliver_at = now_ms + _draw_delay_ms(delay, rng)
                if delay.burst_ms:
                    deliver_at = -(-deliver_at // delay.burst_ms) * delay.burst_ms
                props[DUE] = str(deliver_at)
        body = header + self.payload[len(header):] if header else self.payload
        return Message(self.topic, body, tags=tags, properties=props, delay_level=level, deliver_at_ms=deliver_at)


def _chooser(weighted: tuple[tuple[str, float], ...]) -> Callable[[random.Random], str]:
    values = [v for v, _ in weighted]
    cumulative = []
    total = 0.0
    for _, w in weighted:
        total += w
        cumulative.append(total)

    def choose(rng: random.Random) -> str:
        x = rng.random() * total
        lo, hi = 0, len(cumulative) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cumulative[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        return values[lo]

    return choose


def _draw_delay_ms(delay: DelayMix, rng: random.Random) -> int:
    low, high = delay.min_delay_s, delay.max_delay_s
    if delay.distribution == "uniform":
        seconds = rng.uniform(low, high)
    else:
        # Exponential above the minimum, truncated at the maximum by redrawing (keeps the shape).
        while True:
            seconds = low + rng.expovariate(1.0 / delay.mean_delay_s)
            if seconds <= high:
                break
    return max(1, math.floor(seconds * 1000))
