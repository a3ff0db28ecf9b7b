"""The workload on a ManualClock: deterministic logic metrics (lateness, balance, churn).

Sends, churn events and consumer steps are placed on one virtual timeline. Timers (delay
dispatch, heartbeats) run inside ``clock.set`` at their own deadlines, so lateness does not
depend on the step; consumers drain what is available every ``step_ms``. After the measured
period the clock keeps stepping until every delayed message is delivered and consumed (or until
``drain_s`` / the longest delay plus a minute has passed).
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs

from plugmq.client.producer import Producer
from plugmq.core.clock import ManualClock
from plugmq.core.errors import DelayUnsupportedError, PlugmqError
from plugmq.core.message import Message, MessageQueue
from plugmq.spark.experiments import Experiment
from plugmq.spark.replay import Replay
from plugmq.spark.results import ExperimentResult
from plugmq.spark.workload import (
    ChurnEvent,
    MessageFactory,
    SendEvent,
    churn_events,
    send_events,
)

__all__ = ["VirtualReplay"]


@attrs.define
class _Change:
    """A group's ownership after a membership change. ``imbalance``: max/min queues per member
    (None when a member has none); ``overload``: the busiest member's queues over the fair share
    ceil(queues / members)."""

    moved: int
    imbalance: float | None
    overload: float
    idle: int

_DRAIN_MARGIN_S = 60.0


class VirtualReplay(Replay):
    clock_kind = "virtual"

    def __init__(self, exp: Experiment, data_dir: Path, result: ExperimentResult, window_s: float) -> None:
        super().__init__(exp, data_dir, result, window_s)
        self.clock = ManualClock()
        self.start = self.clock.now()
        self.rng = random.Random(f"victims-{exp.seed}")
        self.owners: dict[str, dict[MessageQueue, str]] = {}
        self.changes: list[_Change] = []
        self.initial: list[_Change] = []
        self.backlog_max = 0
        self.published = self.errors = self.scheduled = 0
        self.send_wall_s = 0.0
        self.first_error: BaseException | None = None

    def elapsed(self) -> float:
        return self.clock.now() - self.start

    def run(self) -> None:
        try:
            self._run()
            self.finish()
        finally:
            self.close()

    def _run(self) -> None:
        w = self.w
        self.open(self.clock)
        factories = {(t, p): MessageFactory(w, self.exp.seed, t, f"{t}.{p}", self.levels_ms)
                     for t in range(w.topics) for p in range(w.producers_per_topic)}
        producers = {key: self.broker.producer(f"bench_p{key[0]}_{key[1]}") for key in factories}  # type: ignore[union-attr]
        for t in range(w.topics):  # the backlog exists before any consumer starts
            backlog = MessageFactory(w, self.exp.seed, t, f"{t}.backlog", self.levels_ms)
            for _ in range(w.backlog_messages):
                self._send(producers[(t, 0)], [backlog.next(self.clock.now_ms())], warmup=False)
        for group in self.groups:
            for _ in range(w.consumers_per_subscription):
                self.add_consumer(group, background=False)
        self._snapshot(initial=True)
        step = w.step_ms / 1000
        next_step = step
        end = w.warmup_s + w.duration_s
        for event in self._timeline():
            while next_step <= event.at_s:
                self._tick(next_step)
                next_step += step
            self.clock.set(self.start + event.at_s)
            if isinstance(event, SendEvent):
                warm = event.at_s < w.warmup_s
                factory = factories[(event.topic, event.producer)]
                now_ms = self.clock.now_ms()
                messages = [factory.next(now_ms, warmup=warm) for _ in range(event.count)]
                self._send(producers[(event.topic, event.producer)], messages, warmup=warm)
            else:
                self._churn(event)
        while next_step <= end:
            self._tick(next_step)
            next_step += step
        self._drain(next_step, step, end)
        for producer in producers.values():
            producer.close()
        self._figures()

    def _timeline(self) -> Iterator[SendEvent | ChurnEvent]:
        churn = churn_events(self.w.churn, self.w, self.exp.seed)
        return heapq.merge(send_events(self.w), churn, key=lambda e: e.at_s)

    def _send(self, producer: Producer, messages: list[Message], *, warmup: bool) -> None:
        began = time.perf_counter()
        try:
            if len(messages) == 1:
                producer.send(messages[0])
            else:
                producer.send_batch(messages)
        except DelayUnsupportedError:
            raise
        except PlugmqError as exc:
            self.errors += len(messages)
            self.first_error = self.first_error or exc
            return
        finally:
            self.send_wall_s += time.perf_counter() - began
        self.published += len(messages)
        delayed = sum(1 for m in messages if m.is_delayed)
        if not warmup:
            self.scheduled += delayed
        self.series.add(self.elapsed(), "published", len(messages))

    def _tick(self, at_s: float) -> None:
        self.clock.set(self.start + at_s)
        for group in self.groups:
            for consumer in group.consumers:
                consumer.consume_available()
        if self.w.churn is not None:
            self._snapshot()
        backlog = self.backlog()
        self.backlog_max = max(self.backlog_max, backlog)
        self.series.peak(at_s, "backlog_max", backlog)

    def _drain(self, next_step: float, step: float, end: float) -> None:
        delay = self.w.delay
        if self.w.drain_s > 0:
            limit = end + self.w.drain_s
        elif delay is not None and delay.fraction > 0:
            longest = (max(self.levels_ms[min(lv, len(self.levels_ms)) - 1] for lv in delay.levels) / 1000
                       if delay.levels else delay.max_delay_s)
            limit = end + longest + _DRAIN_MARGIN_S
        else:
            limit = end + _DRAIN_MARGIN_S
        broker = self.broker
        assert broker is not None
        drain_step = max(step, 1.0)
        while next_step <= limit:
            pending = broker.delay.pending() if broker.delay is not None else 0
            if pending == 0 and self.backlog() == 0:
                break
            self._tick(next_step)
            next_step += drain_step
        self._tick(next_step)
        self.result.metric("drain_virtual_s", max(0.0, next_step - end), "s", deterministic=True)

    # ------------------------------------------------------------------------------ churn
    def _churn(self, event: ChurnEvent) -> None:
        assert self.w.churn is not None
        for group in self.groups:
            if event.action == "join":
                self.add_consumer(group, background=False)
            elif len(group.consumers) > self.w.churn.min_consumers:
                victim = group.consumers.pop(self.rng.randrange(len(group.consumers)))
                victim.shutdown()
        self._snapshot(event=True)

    def _snapshot(self, *, initial: bool = False, event: bool = False) -> None:
        """Compare every group's ownership with the last one seen.

        After a join or leave (``event``) the change is recorded even when no queue moved (a ring
        join can leave every queue where it was): "moved per membership change" counts per event.
        Between events a change is recorded only if ownership moved (a member dropped for missing
        heartbeats).
        """
        for group in self.groups:
            owners = {q: c.client_id for c in group.consumers for q in c.owned_queues() if q.topic == group.topic}
            counts = Counter({c.client_id: 0 for c in group.consumers})
            counts.update(owners.values())
            low, high = min(counts.values()), max(counts.values())
            change = _Change(
                moved=0, imbalance=high / low if low > 0 else None,
                overload=high / -(-len(group.queues) // len(counts)),
                idle=sum(1 for n in counts.values() if n == 0))
            previous = self.owners.get(group.name)
            self.owners[group.name] = owners
            if initial:
                self.initial.append(change)
                continue
            if previous is None or (previous == owners and not event):
                continue
            change.moved = sum(1 for q, owner in previous.items() if owners.get(q) != owner)
            self.changes.append(change)

    # ------------------------------------------------------------------------------ figures
    def _figures(self) -> None:
        r = self.result
        if self.published == 0 and self.errors:
            raise RuntimeError(f"every send failed; the first error: {self.first_error!r}")
        r.metric("messages_published", self.published, "msg", deterministic=True)
        r.metric("publish_errors", self.errors, "msg", deterministic=True)
        r.metric("delay_scheduled", self.scheduled, "msg", deterministic=True)
        if self.published:
            r.metric("publish_cost_us_per_msg", self.send_wall_s * 1e6 / self.published, "us")
        r.metric("backlog_max", self.backlog_max, "msg", deterministic=True)
        r.metric("backlog_final", self.backlog(), "msg", deterministic=True)
        initial = [c.imbalance for c in self.initial if c.imbalance is not None]
        if initial:
            r.metric("allocation_imbalance_initial", max(initial), "x", deterministic=True)
        if self.initial:
            r.metric("allocation_overload_initial", max(c.overload for c in self.initial), "x", deterministic=True)
        if self.w.churn is not None:
            r.metric("allocation_membership_changes", len(self.changes), "", deterministic=True)
            if self.changes:
                self._churn_figures()
        self.result.series.extend(self.series.rows({"published": "publish_rate_msg_s", "consumed": "consume_rate_msg_s"},
                                                   horizon_s=self.elapsed()))

    def _churn_figures(self) -> None:
        """What the membership changes did to the allocation (queues moved, overload, imbalance)."""
        r, changes = self.result, self.changes
        moved = [c.moved for c in changes]
        ratios = [c.imbalance for c in changes if c.imbalance is not None]
        r.metric("allocation_queues_moved_per_change", sum(moved) / len(moved), "queues", deterministic=True)
        r.metric("allocation_queues_moved_max", max(moved), "queues", deterministic=True)
        r.metric("allocation_changes_moving_nothing", sum(1 for m in moved if m == 0), "", deterministic=True)
        r.metric("allocation_overload", sum(c.overload for c in changes) / len(changes), "x", deterministic=True)
        r.metric("allocation_overload_max", max(c.overload for c in changes), "x", deterministic=True)
        r.metric("allocation_idle_member_changes", sum(1 for c in changes if c.idle), "", deterministic=True)
        if ratios:
            r.metric("allocation_imbalance", sum(ratios) / len(ratios), "x", deterministic=True)
            r.metric("allocation_imbalance_max", max(ratios), "x", deterministic=True)
