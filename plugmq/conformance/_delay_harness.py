"""The delay suite's harness: a real store, the scheduler under test, and a record of deliveries.

The store plays the broker's part: the scheduler's write-back appends to it (``deliver`` one
message as ``Broker._deliver`` does, ``deliver_batch`` several with one ``append_batch`` as
``Broker._deliver_batch`` does) and ``was_delivered`` asks it for the request's unique id and
reconsume times (as ``Broker._was_delivered`` does). Requests are built the way the broker
builds them, so a strategy sees exactly what it would see inside a broker.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugmq.broker.components import open_delay_scheduler, open_store, plugin_declaration
from plugmq.conformance import _delay_child as child
from plugmq.core import (
    AppendRequest,
    AppendResult,
    DelayCapabilities,
    DelayScheduler,
    Family,
    ManualClock,
    MessageStore,
    Prop,
    tags_code,
)
from plugmq.core.contracts.delay import ReschedulableDelay
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS

__all__ = ["STORE_ENV", "DelayHarness", "Delivery", "Sent", "pick_store"]

STORE_ENV = "PLUGMQ_DELAY_CONFORMANCE_STORE"
STORE_CANDIDATES = ("store_mmap", "store_lmdb", "store_rocks")
STORE_HOST = child.STORE_HOST
TOPIC = "DelayConformance"
QUEUES = 3
DELAY_PROPS = (Prop.DELAY_LEVEL, Prop.DELIVER_AT_MS, Prop.REAL_TOPIC, Prop.REAL_QUEUE_ID)


def pick_store(candidates: tuple[str, ...] = STORE_CANDIDATES) -> str:
    """The store the suite runs on: ``$PLUGMQ_DELAY_CONFORMANCE_STORE``, else the first that loads."""
    wanted = os.environ.get(STORE_ENV)
    for name in ([wanted] if wanted else candidates):
        try:
            if Family.STORAGE in plugin_declaration(name).families:
                return name
        except Exception:  # noqa: BLE001 - an unusable store is simply not a candidate
            continue
    pytest.skip(f"no storage plugin loads ({wanted or ', '.join(candidates)}); the delay suite needs a real store")


@attrs.frozen
class Sent:
    uid: str
    seq: int
    due_ms: int
    level: int | None
    request: AppendRequest
    msg_id: str
    sent_ms: int

    @property
    def effective_due(self) -> int:
        """A deliver time already past when sent means "now"."""
        return max(self.due_ms, self.sent_ms)

    def tick(self, resolution_ms: int) -> int:
        """The first tick boundary at or after the deliver time; "now" or the past means the next
        boundary after sending (a strategy may take the current tick as already handled)."""
        if self.due_ms > self.sent_ms:
            return -(-self.due_ms // resolution_ms)
        return -(-(self.sent_ms + 1) // resolution_ms)


@attrs.frozen
class Delivery:
    at_ms: int
    request: AppendRequest

    @property
    def uid(self) -> str:
        return self.request.properties[Prop.UNIQ_KEY]


def was_delivered_in(store: MessageStore) -> Callable[[AppendRequest], bool]:
    return child.was_delivered_in(store)


class DelayHarness:
    """Opens store + scheduler in one directory on one ManualClock; closes them at teardown."""

    def __init__(self, plugin: str, data_dir: Path, clock: ManualClock,
                 store_plugins: tuple[str, ...] = STORE_CANDIDATES) -> None:
        self.plugin = plugin
        self.data_dir = data_dir
        self.clock = clock
        self.store_plugin = pick_store(store_plugins)
        self.store: MessageStore | None = None
        self.scheduler: DelayScheduler | None = None
        self.sent: dict[str, Sent] = {}
        self.deliveries: list[Delivery] = []
        self.batches: list[int] = []  # sizes of the deliver_batch calls
        self._seq = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self, *, start: bool = True) -> DelayScheduler:
        self.store = open_store(self.store_plugin, self.data_dir, clock=self.clock, store_host=STORE_HOST)
        self.scheduler = open_delay_scheduler(
            self.plugin, self.data_dir, deliver=self._deliver, clock=self.clock, store=self.store,
            was_delivered=was_delivered_in(self.store), store_host=STORE_HOST, deliver_batch=self._deliver_batch,
        )
        if start:
            self.scheduler.start()
        return self.scheduler

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if self.store is not None:
            self.store.close()
            self.store = None

    def restart(self) -> DelayScheduler:
        self.close()
        return self.open()

    def _deliver(self, request: AppendRequest) -> AppendResult:
        assert self.store is not None, "write-back after the store was closed"
        result = self.store.append(request)
        self.deliveries.append(Delivery(self.clock.now_ms(), request))
        return result

    def _deliver_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        assert self.store is not None, "write-back after the store was closed"
        results = self.store.append_batch(requests)
        now = self.clock.now_ms()
        self.deliveries.extend(Delivery(now, r) for r in requests)
        self.batches.append(len(requests))
        return results

    @property
    def caps(self) -> DelayCapabilities:
        assert self.scheduler is not None
        caps = self.scheduler.capabilities
        assert isinstance(caps, DelayCapabilities)
        return caps

    @property
    def levels(self) -> tuple[int, ...]:
        """The level list the broker would use for this strategy."""
        return self.caps.levels_ms or DEFAULT_DELAY_LEVELS_MS

    # -- sending --------------------------------------------------------------------------------
    def build(self, uid: str, *, level: int | None, due_ms: int, topic: str = TOPIC,
              queue_id: int | None = None) -> AppendRequest:
        """The request ``Broker._schedule`` would hand the strategy."""
        seq = self._seq
        props = {Prop.UNIQ_KEY: uid, Prop.TAGS: f"Tag{seq % 3}", Prop.KEYS: f"key-{uid}", "seq": str(seq),
                 "unicode": "\u00e9\u4e2d"}
        props[Prop.DELAY_LEVEL if level is not None else Prop.DELIVER_AT_MS] = str(level if level is not None else due_ms)
        return AppendRequest(
            topic=topic, queue_id=seq % QUEUES if queue_id is None else queue_id, body=f"body of {uid}".encode() * 3,
            properties=props, tags_code=tags_code(props[Prop.TAGS]), born_timestamp_ms=self.clock.now_ms(),
            born_host="10.9.8.7:4242", reconsume_times=seq % 4,
        )

    def send(self, uid: str, *, level: int | None = None, delay_ms: int | None = None,
             due_ms: int | None = None, **kwargs: Any) -> Sent:
        """Schedule like the broker: a level (deliver time from the level list) or a deliver time."""
        assert self.scheduler is not None
        now = self.clock.now_ms()
        if level is not None:
            due = now + self.levels[min(level, len(self.levels)) - 1]
        else:
            due = due_ms if due_ms is not None else now + (delay_ms or 0)
        request = self.build(uid, level=level, due_ms=due, **kwargs)
        result = self.scheduler.schedule(request, deliver_at_ms=due, delay_level=level)
        sent = Sent(uid, self._seq, due, level, request, result.msg_id, now)
        self._seq += 1
        self.sent[uid] = sent
        return sent

    def reschedule(self, uid: str, due_ms: int) -> Sent | None:
        """Move ``uid`` with the scheduler's ``reschedule``; on success the record of what was
        sent follows it (new deliver time and msg id, moved "now": it orders like a new send)."""
        assert isinstance(self.scheduler, ReschedulableDelay)
        old = self.sent[uid]
        result = self.scheduler.reschedule(old.msg_id, due_ms)
        if result is None:
            return None
        moved = Sent(uid, self._seq, due_ms, None, old.request, result.msg_id, self.clock.now_ms())
        self._seq += 1
        self.sent[uid] = moved
        return moved

    def some_delay(self, rng: random.Random, *, longest_ms: int = 120_000) -> dict[str, int]:
        """Keyword arguments of :meth:`send` for a delay this strategy can express."""
        caps = self.caps
        if not caps.arbitrary_delay:
            usable = [i + 1 for i, ms in enumerate(self.levels) if ms <= longest_ms] or [1]
            return {"level": rng.choice(usable)}
        if rng.random() < 0.2:
            usable = [i + 1 for i, ms in enumerate(DEFAULT_DELAY_LEVELS_MS) if ms <= longest_ms] or [1]
            return {"level": rng.choice(usable)}
        edge = rng.choice([0, 1, 499, 500, 999, 1000, 1001, 1500, 59_999, 60_000])
        return {"delay_ms": rng.choice([edge, rng.randint(0, longest_ms), -rng.randint(1, 5000)])}

    # -- time -----------------------------------------------------------------------------------
    def advance_to(self, ms: int) -> None:
        if ms > self.clock.now_ms():
            self.clock.set(ms / 1000)
        self.clock.run_due()

    def latest_due(self) -> int:
        return max((s.effective_due for s in self.sent.values()), default=self.clock.now_ms())

    def run_past_all(self, *, step_ms: int | None = None) -> None:
        """Move the clock in steps until one resolution past the latest deliver time."""
        end = self.latest_due() + self.caps.resolution_ms + 1
        step = step_ms or max(1, (end - self.clock.now_ms()) // 50)
        while self.clock.now_ms() < end:
            self.advance_to(min(end, self.clock.now_ms() + step))

    # -- checks ---------------------------------------------------------------------------------
    def stored_uids(self, topic: str = TOPIC) -> collections.Counter[str]:
        """How often each unique id is on ``topic`` in the store (the truth across restarts)."""
        assert self.store is not None
        found: collections.Counter[str] = collections.Counter()
        for queue_id in range(self.store.queues().get(topic, 0)):
            offset = self.store.min_offset(topic, queue_id)
            while True:
                entries = self.store.read_queue(topic, queue_id, offset, 512)
                if not entries:
                    break
                for entry in entries:
                    message = self.store.read(entry.commit_log_offset, entry.size)
                    assert message is not None, f"{topic}:{queue_id} entry {entry.queue_offset} unreadable"
                    found[message.unique_id or "?"] += 1
                offset = entries[-1].queue_offset + 1
        return found

    def check_restored(self, delivery: Delivery) -> None:
        """The write-back is the original message on its real topic, delay properties cleared."""
        sent = self.sent[delivery.uid]
        got, want = delivery.request, sent.request
        assert (got.topic, got.queue_id) == (want.topic, want.queue_id), f"{sent.uid} went to the wrong queue"
        assert got.body == want.body, f"{sent.uid}: body changed"
        expected = {k: v for k, v in want.properties.items() if k not in DELAY_PROPS}
        assert dict(got.properties) == expected, f"{sent.uid}: properties not restored (delay ones must be cleared)"
        assert got.tags_code == tags_code(want.properties.get(Prop.TAGS)), f"{sent.uid}: tag code not the tags' hash"
        assert (got.reconsume_times, got.born_timestamp_ms, got.born_host, got.sys_flag) == (
            want.reconsume_times, want.born_timestamp_ms, want.born_host, want.sys_flag), f"{sent.uid}: fields changed"

    def check_timing(self, *, late_bound_ms: int | None = None) -> None:
        """Never early; late by at most ``late_bound_ms`` (default one resolution)."""
        bound = self.caps.resolution_ms if late_bound_ms is None else late_bound_ms
        for delivery in self.deliveries:
            due = self.sent[delivery.uid].effective_due
            assert delivery.at_ms >= due, f"{delivery.uid} delivered {due - delivery.at_ms} ms early"
            assert delivery.at_ms - due <= bound, (
                f"{delivery.uid} delivered {delivery.at_ms - due} ms late; the bound is {bound} ms")

    def check_order(self, deliveries: list[Delivery] | None = None) -> None:
        """Equal deliver times keep sending order (within a level for level strategies); a message
        whose tick (the first multiple of ``resolution_ms`` at or after its deliver time) is earlier
        is delivered first."""
        resolution = self.caps.resolution_ms
        seq = deliveries if deliveries is not None else self.deliveries
        keyed = [(self.sent[d.uid].effective_due, self.sent[d.uid].seq, d.uid) for d in seq]
        # Send order binds equal deliver times within a lane: one level of a level strategy
        # (levels are independent queues), everything of an arbitrary-delay strategy.
        by_due: dict[tuple[int, int | None], list[tuple[int, str]]] = collections.defaultdict(list)
        for _, number, uid in keyed:  # a deliver time in the past may go before "now": group by the real one
            lane = None if self.caps.arbitrary_delay else self.sent[uid].level
            by_due[self.sent[uid].due_ms, lane].append((number, uid))
        for due, group in by_due.items():
            for (seq_a, uid_a), (seq_b, uid_b) in itertools.pairwise(group):
                assert seq_a < seq_b, f"{uid_b} overtook {uid_a}: same deliver time {due[0]}, sent later"
        slots = [self.sent[uid].tick(resolution) for _, _, uid in keyed]
        later: tuple[int, str] | None = None  # smallest tick among the deliveries after this one
        for index in range(len(keyed) - 1, -1, -1):
            if later is not None:
                assert slots[index] <= later[0], (
                    f"{keyed[index][2]} (due {keyed[index][0]}) was delivered before {later[1]} "
                    f"(due {self.sent[later[1]].effective_due}), which was due at least a tick earlier")
            if later is None or slots[index] < later[0]:
                later = (slots[index], keyed[index][2])
