"""One policy across the delay family: option names, deprecated names, durability default, the
batched write-back inside a broker, and the strategies on a real clock with producer threads."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugmq.broker.components import open_delay_scheduler, open_store, plugin_declaration
from plugmq.core import AppendRequest, AppendResult, AppendStatus, ConfigError, ManualClock, Message, MessageQueue, Prop
from plugmq.core.clock import SystemClock
from plugmq.core.pluginmanager import build_options
from tests.fixtures.brokers import BrokerFactory

PLUGINS = ("delay_level", "delay_wheel", "delay_schedule")
COMMON = {"clamp_to_max_delay", "fsync", "dispatch_batch", "retry_after_error_ms", "dead_letter_older_than_ms",
          "dead_letter_topic"}


def _options(plugin: str, table: dict[str, Any]) -> Any:
    return build_options(plugin_declaration(plugin), table, config_path=f"plugins.{plugin}")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_family_shares_option_names_and_the_durability_default(plugin: str) -> None:
    options = _options(plugin, {})
    names = {f.name for f in attrs.fields(type(options))}
    assert names >= COMMON
    assert ("max_delay_ms" in names) == (plugin != "delay_level")  # levels end at the last level
    assert options.fsync is False  # kill -9 safe, not power-cut safe: what an async-flush store promises
    assert plugin_declaration(plugin).capabilities.resolution_ms == 1


@pytest.mark.parametrize(("plugin", "old", "value", "new", "expected"), [
    ("delay_wheel", "clamp_over_max", True, "clamp_to_max_delay", True),
    ("delay_level", "clamp_over_max", False, "clamp_to_max_delay", False),
    ("delay_level", "fsync_offsets", True, "fsync", True),
    ("delay_level", "flush_store_before_persist", True, "fsync", True),
    ("delay_schedule", "retry_delay_ms", 2500, "retry_after_error_ms", 2500),
])
def test_old_option_names_still_work_with_a_deprecation_warning(plugin: str, old: str, value: object, new: str,
                                                                expected: object) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old}.*{new}"):
        options = _options(plugin, {old: value})
    assert getattr(options, new) == expected and getattr(options, old) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _options(plugin, {new: expected})  # the new name alone warns about nothing


def test_an_old_name_contradicting_the_new_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="clamp_over_max.*clamp_to_max_delay"):
        _options("delay_wheel", {"clamp_over_max": False, "clamp_to_max_delay": True})


@pytest.mark.parametrize("plugin", ["delay_wheel", "delay_schedule"])
def test_inside_a_broker_a_burst_goes_out_in_store_batches(make_broker: BrokerFactory, clock: ManualClock,
                                                           plugin: str) -> None:
    broker = make_broker(["store_mmap", plugin])
    due = clock.now_ms() + 5_000
    with broker.producer("P") as producer:
        for i in range(300):
            producer.send(Message(f"Burst{i % 2}", f"m{i}".encode(), deliver_at_ms=due))
    clock.set(due / 1000 - 0.001)
    assert broker.delay is not None and broker.delay.pending() == 300
    clock.set(due / 1000)
    assert broker.delay.pending() == 0
    bodies: set[bytes] = set()
    for topic in ("Burst0", "Burst1"):
        for queue_id in range(broker.config.default_queue_count):
            queue = MessageQueue(topic, broker.name, queue_id)
            bodies.update(m.body for m in broker.pull(queue, 0, 300).messages)
    assert bodies == {f"m{i}".encode() for i in range(300)}
    assert broker.delay.metrics()["batches"] == 1  # one store batch for all 300
    assert broker.topics.get("Burst1") == broker.config.default_queue_count


class _Recorder:
    """The write-back on the real clock: when each message arrived, and an event for the last."""

    def __init__(self, clock: SystemClock, total: int) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.seen: list[tuple[int, str]] = []
        self.total = total
        self.done = threading.Event()

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        now = self.clock.now_ms()
        with self.lock:
            self.seen.extend((now, r.properties[Prop.UNIQ_KEY]) for r in requests)
            if len(self.seen) >= self.total:
                self.done.set()
        return [AppendResult(AppendStatus.PUT_OK, "00" * 16, 0, 0, 1, now) for _ in requests]

    def deliver(self, request: AppendRequest) -> AppendResult:
        return self.deliver_batch([request])[0]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_producer_threads_and_the_clock_thread_on_the_real_clock(tmp_path: Path, plugin: str) -> None:
    """Four producers schedule while the clock's thread delivers (outside the strategy's lock);
    waits on an event, never on a sleep; asserts nothing about timing but "never early"."""
    clock = SystemClock()
    total = 4 * 150
    recorder = _Recorder(clock, total)
    store = open_store("store_lmdb", tmp_path, clock=clock) if plugin == "delay_level" else None
    scheduler = open_delay_scheduler(plugin, tmp_path, deliver=recorder.deliver, deliver_batch=recorder.deliver_batch,
                                     clock=clock, store=store, options={"levels": "1s"} if store else {})
    scheduler.start()
    due: dict[str, int] = {}

    def produce(worker: int) -> None:
        for i in range(150):
            uid = f"w{worker}-{i}"
            delay = 1000 if store else (i * 7 + worker) % 300
            when = clock.now_ms() + delay
            due[uid] = when
            request = AppendRequest(topic="T", queue_id=worker, body=b"x", properties={Prop.UNIQ_KEY: uid})
            scheduler.schedule(request, deliver_at_ms=when, delay_level=1 if store else None)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert recorder.done.wait(60), f"only {len(recorder.seen)} of {total} delivered"
    finally:
        scheduler.close()
        if store is not None:
            store.close()
    assert sorted(uid for _, uid in recorder.seen) == sorted(due), "lost or doubled"
    assert all(at >= due[uid] for at, uid in recorder.seen), "delivered early"
    assert time.monotonic() - started < 60
