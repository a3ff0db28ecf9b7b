"""Pop consumption in the core (plugmq.broker.pop) and its durable state: a real broker on a ManualClock.

The same PopService serves ``broker.simple_consumer`` and the gRPC server; these tests drive it
directly, restarting the whole broker where durability matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.broker.broker import Broker
from plugmq.broker.pop import PopService
from plugmq.client.values import ReceivedMessage
from plugmq.core import ManualClock, Message, MessageQueue, Prop
from plugmq.core.errors import CorruptRecordError, ReceiptHandleError
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import dlq_topic
from tests.helpers.legacy_state import write_legacy_pop

TOPIC = "Pop"
GROUPS = {"fifo": {"fifo": True}, "g": {"max_delivery_attempts": 3}}


class Rig:
    """A broker on a ManualClock, its pop service, and a way to restart the broker from its files."""

    def __init__(self, directory: Path, *, queues: int = 1, compact_bytes: int = 8 << 20,
                 consume_from: ConsumeFrom = ConsumeFrom.FIRST_OFFSET) -> None:
        self.clock = ManualClock()
        self.directory = directory
        self.compact_bytes = compact_bytes
        self.consume_from = consume_from
        self.broker = self._open()
        self.broker.create_topic(TOPIC, queues)

    def _open(self) -> Broker:
        return Broker.open(self.directory / "data", clock=self.clock, plugins=["store_mmap", "filter_tag"],
                           groups=GROUPS, pop_compact_bytes=self.compact_bytes)

    @property
    def pop(self) -> PopService:
        return self.broker.pop

    def restart(self) -> None:
        self.broker.close()
        self.broker = self._open()

    def send(self, body: str, *, queue: int = 0, tags: str | None = None, group: str | None = None) -> None:
        extra = {Prop.SHARDING_KEY: group} if group else None
        self.broker.put(Message(TOPIC, body.encode(), tags=tags), queue, extra_properties=extra)

    def receive(self, group: str = "g", batch: int = 16, invisible_s: float = 10, expression: str | None = None
                ) -> list[ReceivedMessage]:
        subscription = self.broker.compile_subscription("TAG", expression) if expression else None
        return self.pop.receive(group, TOPIC, subscription, batch, round(invisible_s * 1000),
                                consume_from=self.consume_from)

    def dead_letters(self, group: str = "g") -> list[Any]:
        queue = MessageQueue(dlq_topic(group), self.broker.name, 0)
        if self.broker.topics.get(queue.topic) is None:
            return []
        return list(self.broker.pull(queue, 0, 64).messages)

    def close(self) -> None:
        self.broker.close()


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    r = Rig(tmp_path)
    yield r
    r.close()


def bodies(received: list[ReceivedMessage]) -> list[str]:
    return [m.body.decode() for m in received]

def test_receive_then_ack_finishes_a_message(rig: Rig) -> None:
    for i in range(3):
        rig.send(f"m{i}")
    got = rig.receive(batch=2)
    assert bodies(got) == ["m0", "m1"] and [m.delivery_attempt for m in got] == [1, 1]
    assert bodies(rig.receive()) == ["m2"]
    for delivery in got:
        rig.pop.ack("g", TOPIC, delivery.receipt_handle)
    rig.clock.advance(60)
    assert bodies(rig.receive()) == ["m2"]  # only the unacked one comes back
    with pytest.raises(ReceiptHandleError, match="acknowledged already"):
        rig.pop.ack("g", TOPIC, got[0].receipt_handle)


def test_malformed_or_foreign_receipt_handles_are_invalid(rig: Rig) -> None:
    rig.send("m")
    (delivery,) = rig.receive()
    for group, handle in (("g", "garbage"), ("other", delivery.receipt_handle)):
        with pytest.raises(ReceiptHandleError):
            rig.pop.ack(group, TOPIC, handle)


def test_timed_out_message_is_redelivered_with_the_next_attempt_and_the_old_handle_is_stale(rig: Rig) -> None:
    rig.send("m")
    (first,) = rig.receive(invisible_s=5)
    assert rig.pop.next_deadline() == rig.clock.now_ms() + 5000
    rig.clock.advance(4.9)
    assert rig.receive() == []
    rig.clock.advance(0.2)
    (second,) = rig.receive(invisible_s=5)
    assert (second.delivery_attempt, second.queue_offset) == (2, first.queue_offset)
    with pytest.raises(ReceiptHandleError, match=r"stale.*attempt 2"):
        rig.pop.ack("g", TOPIC, first.receipt_handle)
    rig.pop.ack("g", TOPIC, second.receipt_handle)


def test_ack_after_the_deadline_but_before_redelivery_still_counts(rig: Rig) -> None:
    rig.send("m")
    (delivery,) = rig.receive(invisible_s=5)
    rig.clock.advance(30)
    rig.pop.ack("g", TOPIC, delivery.receipt_handle)
    assert rig.receive() == []


def test_change_invisible_moves_the_deadline_and_issues_a_new_handle(rig: Rig) -> None:
    rig.send("m")
    (delivery,) = rig.receive(invisible_s=5)
    handle = rig.pop.change_invisible_duration("g", TOPIC, delivery.receipt_handle, 60_000)
    assert handle != delivery.receipt_handle
    rig.clock.advance(30)
    assert rig.receive() == []
    with pytest.raises(ReceiptHandleError):
        rig.pop.ack("g", TOPIC, delivery.receipt_handle)
    rig.pop.ack("g", TOPIC, handle)


def test_the_last_attempt_timing_out_moves_the_message_to_the_dlq(rig: Rig) -> None:
    rig.send("poison", tags="T")
    for attempt in (1, 2, 3):
        (delivery,) = rig.receive(invisible_s=1)
        assert delivery.delivery_attempt == attempt
        rig.clock.advance(2)
    assert rig.pop.inflight_count() == 0  # dead-lettered by the clock's timer, without any receive asking
    assert rig.pop.revive() is None
    (dead,) = rig.dead_letters()
    assert (dead.body, dead.tags, dead.reconsume_times) == (b"poison", "T", 2)
    assert dead.properties[Prop.RETRY_TOPIC] == TOPIC
    assert rig.receive() == []


def test_forward_to_dlq_ends_the_message_for_the_group(rig: Rig) -> None:
    rig.send("m")
    (delivery,) = rig.receive()
    rig.pop.forward_to_dead_letter_queue("g", TOPIC, delivery.receipt_handle)
    assert [m.body for m in rig.dead_letters()] == [b"m"]
    rig.clock.advance(600)
    assert rig.receive() == []


def test_groups_are_independent(rig: Rig) -> None:
    rig.send("m")
    assert bodies(rig.receive("g")) == ["m"]
    assert bodies(rig.receive("h")) == ["m"]


def test_filtered_out_messages_are_skipped_for_good(rig: Rig) -> None:
    for i, tag in enumerate(["A", "B", "A", "B"]):
        rig.send(f"m{i}", tags=tag)
    assert bodies(rig.receive(expression="A")) == ["m0", "m2"]
    rig.clock.advance(60)
    assert bodies(rig.receive(expression="*")) == ["m0", "m2"]  # redeliveries; B's were consumed by the filter


def test_new_group_from_last_skips_older_messages(tmp_path: Path) -> None:
    r = Rig(tmp_path, consume_from=ConsumeFrom.LAST_OFFSET)
    try:
        r.send("old")
        assert r.receive() == []
        r.send("new")
        assert bodies(r.receive()) == ["new"]
    finally:
        r.close()


def test_fifo_queue_waits_for_acks_and_never_hands_out_two_of_one_group(rig: Rig) -> None:
    for body, group in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B")]:
        rig.send(body, group=group)
    first = rig.receive("fifo")
    assert bodies(first) == ["a1", "b1"]  # a2 would be A's second message in flight
    rig.pop.ack("fifo", TOPIC, first[0].receipt_handle)
    assert rig.receive("fifo") == []  # b1 still in flight: the queue stays blocked
    rig.clock.advance(11)
    (again,) = rig.receive("fifo")
    assert (bodies([again]), again.delivery_attempt) == (["b1"], 2)
    rig.pop.ack("fifo", TOPIC, again.receipt_handle)
    assert bodies(rig.receive("fifo")) == ["a2", "b2"]


def test_fifo_blocks_per_queue_only(tmp_path: Path) -> None:
    r = Rig(tmp_path, queues=2)
    try:
        r.send("q0-a", queue=0, group="A")
        r.send("q0-a2", queue=0, group="A")
        r.send("q1-c", queue=1, group="C")
        assert sorted(bodies(r.receive("fifo"))) == ["q0-a", "q1-c"]
    finally:
        r.close()


def test_restart_replays_acks_cursor_and_in_flight_attempts(rig: Rig) -> None:
    for i in range(4):
        rig.send(f"m{i}")
    got = rig.receive(batch=3, invisible_s=5)
    rig.pop.ack("g", TOPIC, got[0].receipt_handle)
    rig.clock.advance(6)
    (retry,) = rig.receive(batch=1, invisible_s=5)
    assert retry.delivery_attempt == 2
    rig.restart()
    rig.clock.advance(6)
    after = rig.receive(invisible_s=5)
    assert [(m.body, m.delivery_attempt) for m in after] == [(b"m1", 3), (b"m2", 2), (b"m3", 1)]
    with pytest.raises(ReceiptHandleError):
        rig.pop.ack("g", TOPIC, retry.receipt_handle)  # superseded before the restart... and after it
    for delivery in after:
        rig.pop.ack("g", TOPIC, delivery.receipt_handle)
    rig.restart()
    rig.clock.advance(600)
    assert rig.receive() == []


def _legacy(rig: Rig, log_ops: list[Any]) -> Path:
    """Older plugmq's pop files for "m" (in flight, attempt 1), imported at the next open."""
    rig.send("m")
    pop_dir = rig.broker.data_dir / "broker" / "pop"
    now = rig.clock.now_ms()
    write_legacy_pop(pop_dir, rig.broker.store, group="g", topic=TOPIC, next_offset=1,
                     inflight={0: (1, now + 10_000, 1)}, log_ops=log_ops)
    rig.broker.close()
    return pop_dir / "pop-1.log"


def test_a_torn_last_record_of_an_older_log_is_cut_off(rig: Rig) -> None:
    log = _legacy(rig, [["A", 1, [0]]])
    log.write_bytes(log.read_bytes()[:-5])  # the ack record, torn
    rig.broker = rig._open()
    rig.clock.advance(60)
    assert [(m.body, m.delivery_attempt) for m in rig.receive()] == [(b"m", 2)]  # redelivered, never lost


def test_damage_before_the_tail_of_an_older_log_is_refused(rig: Rig) -> None:
    log = _legacy(rig, [["A", 1, [0]]])
    log.write_bytes(b"{not json\n" + log.read_bytes())
    with pytest.raises(CorruptRecordError, match=r"move the directory .*pop aside"):
        rig._open()
    log.unlink()  # what the message says to do, in effect: the group's log is gone; messages stay stored
    rig.broker = rig._open()
    rig.clock.advance(60)
    assert bodies(rig.receive()) == ["m"]


def test_compaction_writes_a_snapshot_and_keeps_the_state(tmp_path: Path) -> None:
    r = Rig(tmp_path, compact_bytes=600)
    try:
        for i in range(12):
            r.send(f"m{i}")
        handles: list[str] = []
        for _ in range(12):
            handles.extend(d.receipt_handle for d in r.receive(batch=1, invisible_s=5))
        for handle in handles[::2]:
            r.pop.ack("g", TOPIC, handle)
        journal = r.broker.journals.journals()["pop"]
        assert journal.bytes_since_snapshot < 600
        replay = journal.replay()
        assert replay.snapshot is not None and len(replay.records) < 12
        r.restart()
        r.clock.advance(6)
        assert bodies(r.receive()) == [f"m{i}" for i in range(1, 12, 2)]
    finally:
        r.close()


# ------------------------------------------------------------------------------------- model
_OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(1, 3)),
    st.tuples(st.just("receive"), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 20)),
    st.tuples(st.just("ack_stale"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.sampled_from([1, 3, 6])),
    st.tuples(st.just("restart"), st.just(0)),
), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_pop_matches_a_model_across_restarts(tmp_path_factory: pytest.TempPathFactory, ops: list[Any]) -> None:
    r = Rig(tmp_path_factory.mktemp("model"), compact_bytes=2000)
    invisible_ms, max_attempts = 5000, 3
    sent = 0
    state: dict[int, dict[str, Any]] = {}  # offset -> attempt, until, handle, done
    stale: list[str] = []
    dead = 0
    try:
        for op, arg in ops:
            now = r.clock.now_ms()
            if op == "send":
                for _ in range(arg):
                    r.send(f"m{sent}")
                    state[sent] = {"attempt": 0, "until": None, "handle": None, "done": False}
                    sent += 1
            elif op == "receive":
                expected = [o for o, s in sorted(state.items()) if not s["done"] and s["until"] is not None
                            and s["until"] <= now]
                expected += [o for o, s in sorted(state.items()) if s["until"] is None]
                expected = expected[:arg]
                got = r.receive(batch=arg, invisible_s=invisible_ms / 1000)
                assert [(m.queue_offset, m.delivery_attempt) for m in got] == \
                    [(o, state[o]["attempt"] + 1) for o in expected]
                for m in got:
                    s = state[m.queue_offset]
                    if s["handle"] is not None:
                        stale.append(s["handle"])
                    s.update(attempt=m.delivery_attempt, until=now + invisible_ms, handle=m.receipt_handle)
            elif op in ("ack", "ack_stale"):
                pool = [s["handle"] for s in state.values() if s["handle"] and not s["done"]] if op == "ack" else stale
                if not pool:
                    continue
                handle = pool[arg % len(pool)]
                live = next((s for s in state.values() if s["handle"] == handle and not s["done"]), None)
                if live is not None and op == "ack":
                    r.pop.ack("g", TOPIC, handle)
                    live["done"] = True
                else:
                    with pytest.raises(ReceiptHandleError):
                        r.pop.ack("g", TOPIC, handle)
            elif op == "advance":
                r.clock.advance(arg)
                now = r.clock.now_ms()
                for s in state.values():  # the clock's timer dead-letters what used its last attempt
                    if not s["done"] and s["until"] is not None and s["until"] <= now and s["attempt"] >= max_attempts:
                        s["done"] = True
                        dead += 1
            else:
                r.restart()
        r.pop.revive()
        assert len(r.dead_letters()) == dead
    finally:
        r.close()
