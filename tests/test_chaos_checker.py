"""The chaos checker on hand-written histories: one per anomaly it must find (and a clean run
where it must find none), plus the JSON lines round trip of a history file."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from plugmq.chaos.checker import PositionConflict, Redelivery, Reordering, StaleAck, check
from plugmq.chaos.history import (
    Ack,
    Delivery,
    Event,
    FaultWindow,
    History,
    Readback,
    Receive,
    RoleSample,
    Send,
    load_history,
)


def send(t: float, seq: int, *, ok: bool = True, queue: int = 0, offset: int | None = None,
         producer: str = "p0") -> Send:
    body = f"{producer}-{seq}"
    if not ok:
        return Send(t, t + 0.01, producer, seq, body, False, error="timeout")
    return Send(t, t + 0.01, producer, seq, body, True, f"id-{body}", queue, seq if offset is None else offset)


def deliver(t: float, body: str, queue: int, offset: int, *, group: str = "g", attempt: int = 1) -> Delivery:
    return Delivery(t, t + 0.01, "c0", group, body, f"id-{body}", queue, offset, attempt)


def ack(t: float, body: str, queue: int, offset: int, *, ok: bool = True, group: str = "g") -> Ack:
    return Ack(t, t + 0.01, "c0", group, body, f"id-{body}", queue, offset, ok, None if ok else "timeout")


def read(body: str, queue: int, offset: int) -> Readback:
    return Readback(100.0, body, f"id-{body}", queue, offset)


def clean_history() -> list[Event]:
    events: list[Event] = []
    for seq in range(5):
        sent = send(seq, seq)
        events += [sent, Receive(seq + 0.1, seq + 0.2, "c0", "g", True, 1), deliver(seq + 0.1, sent.body, 0, seq),
                   ack(seq + 0.3, sent.body, 0, seq), read(sent.body, 0, seq)]
    return events


def test_a_clean_history_has_no_anomaly() -> None:
    result = check(clean_history())
    assert (result.sends, result.acked, result.read_back) == (5, 5, 5)
    assert not result.promise_broken
    assert result.summary() == {"sends": 5, "acked": 5, "send_failures": 0, "read_back": 5, "lost": 0,
                                "lost_seen": 0, "redelivered_after_ack": 0, "position_conflicts": 0,
                                "reordered": 0, "duplicate_deliveries": 0, "stored_twice": 0,
                                "failed_but_stored": 0, "acked_by_deposed_master": 0, "split_brain_s": 0.0,
                                "promise_broken": False}


def test_an_acked_message_missing_from_the_read_back_is_lost_and_seen_if_delivered() -> None:
    events = [e for e in clean_history() if not (isinstance(e, Readback) and e.body in ("p0-3", "p0-4"))]
    events = [e for e in events if not (isinstance(e, Delivery) and e.body == "p0-4")]
    result = check(events)
    assert result.lost == ("p0-3", "p0-4")
    assert result.lost_seen == ("p0-3",), "p0-3 was handed to a consumer before it vanished"
    assert result.promise_broken


def test_a_failed_send_missing_from_the_read_back_is_not_lost_but_one_stored_is_counted() -> None:
    events: list[Event] = [send(0, 0), read("p0-0", 0, 0), send(1, 1, ok=False), send(2, 2, ok=False),
                           read("p0-2", 0, 1)]
    result = check(events)
    assert result.lost == () and result.send_failures == 2
    assert result.failed_but_stored == 1
    assert not result.promise_broken


def test_redelivery_after_an_ok_ack_breaks_the_promise_but_not_after_a_failed_ack() -> None:
    events = [*clean_history(), deliver(10.0, "p0-1", 0, 1, attempt=2)]
    result = check(events)
    assert result.redelivered_after_ack == (Redelivery("g", "p0-1", 1.31, 10.0),)
    windowed = check([*events, FaultWindow(4.0, 6.0, "kill", 1, "n1"), FaultWindow(9.0, 9.5, "kill", 2, "n2")])
    assert [f.redelivered_after_ack for f in windowed.faults] == [0, 1], "charged from its injection to the next"
    assert result.duplicate_deliveries == 1
    assert result.promise_broken
    failed_ack = [e for e in clean_history() if not (isinstance(e, Ack) and e.body == "p0-1")]
    failed_ack += [ack(1.3, "p0-1", 0, 1, ok=False), deliver(10.0, "p0-1", 0, 1, attempt=2)]
    again = check(failed_ack)
    assert again.redelivered_after_ack == () and again.duplicate_deliveries == 1
    assert not again.promise_broken


def test_a_delivery_overlapping_the_ack_is_not_a_redelivery_after_it() -> None:
    # The second receive was invoked before the ack's answer came: at-least-once, not a broken ack.
    events = [*clean_history(), deliver(1.305, "p0-1", 0, 1, attempt=2)]
    assert check(events).redelivered_after_ack == ()


def test_another_group_receiving_an_acked_message_is_no_redelivery() -> None:
    events = [*clean_history(), deliver(10.0, "p0-1", 0, 1, group="other")]
    result = check(events)
    assert result.redelivered_after_ack == () and result.duplicate_deliveries == 0


def test_one_position_holding_two_messages_is_a_conflict_from_receipts_deliveries_or_read_back() -> None:
    events = clean_history()
    events.append(deliver(20.0, "p1-0", 0, 2))  # another message at p0-2's (queue 0, offset 2)
    events.append(Readback(100.0, "p1-1", "id-p1-1", 0, 4))  # the read-back holds another one at p0-4's
    result = check(events)
    assert result.position_conflicts == (PositionConflict(0, 2, ("p0-2", "p1-0")),
                                         PositionConflict(0, 4, ("p0-4", "p1-1")))


def test_a_producer_s_later_message_stored_before_an_earlier_one_in_a_queue_is_reordered() -> None:
    events: list[Event] = [send(0, 0, offset=0), send(1, 1, offset=2), send(2, 2, offset=1), send(3, 3, offset=3)]
    events += [read("p0-0", 0, 0), read("p0-1", 0, 2), read("p0-2", 0, 1), read("p0-3", 0, 3)]
    events += [send(4, 0, producer="p1", queue=1, offset=0), read("p1-0", 1, 0)]
    result = check(events)
    assert result.reordered == (Reordering("p0", 0, 1, 2),)


def test_messages_in_different_queues_are_never_reordered() -> None:
    events: list[Event] = [send(0, 0, queue=0, offset=5), send(1, 1, queue=1, offset=0)]
    events += [read("p0-0", 0, 5), read("p0-1", 1, 0)]
    assert check(events).reordered == ()


def test_a_message_stored_twice_is_counted() -> None:
    events = [*clean_history(), read("p0-2", 1, 0)]
    result = check(events)
    assert result.stored_twice == ("p0-2",)


def test_losses_are_charged_to_the_fault_window_that_ends_after_the_ack_and_recovery_is_timed() -> None:
    events: list[Event] = [send(float(seq), seq) for seq in range(10)]
    events += [read(f"p0-{seq}", 0, seq) for seq in range(10) if seq not in (2, 3, 7)]
    events += [FaultWindow(2.5, 4.0, "kill", 1, "n1"), FaultWindow(6.5, 8.0, "suspend", 2, "n2")]
    events += [send(2.6, 100, ok=False), Receive(2.6, 3.9, "c0", "g", False, error="unavailable"),
               Receive(4.2, 4.5, "c0", "g", True, 0), Receive(6.6, 6.9, "c0", "g", True, 2)]
    result = check(events)
    assert result.lost == ("p0-2", "p0-3", "p0-7")
    kill, suspend = result.faults
    assert (kill.name, kill.round, kill.target, kill.lost) == ("kill", 1, "n1", 2)  # acked at 2.01 and 3.01
    assert kill.send_recovery_s == pytest.approx(3.01 - 2.5)
    assert kill.receive_recovery_s == pytest.approx(4.5 - 2.5)
    assert suspend.lost == 1
    assert kill.redelivered_after_ack == suspend.redelivered_after_ack == 0
    assert suspend.send_recovery_s == pytest.approx(7.01 - 6.5)
    assert suspend.receive_recovery_s == pytest.approx(6.9 - 6.5)


def test_a_fault_after_which_nothing_succeeds_has_no_recovery_time_and_says_how_long_it_was_watched() -> None:
    result = check([send(0.0, 0), read("p0-0", 0, 0), FaultWindow(1.0, 2.0, "zk-down", 1, "zookeeper"),
                    send(4.5, 1, ok=False)])
    assert result.faults[0].send_recovery_s is None and result.faults[0].receive_recovery_s is None
    assert result.faults[0].watched_s == pytest.approx(4.51 - 1.0)


def test_a_success_after_the_next_injection_is_not_the_recovery_from_this_one() -> None:
    result = check([FaultWindow(1.0, 2.0, "kill", 1, "n1"), send(1.5, 0, ok=False),
                    FaultWindow(5.0, 6.0, "kill", 2, "n2"), send(7.0, 1)])
    first, second = result.faults
    assert first.send_recovery_s is None and first.watched_s == 4.0
    assert second.send_recovery_s == pytest.approx(2.01)


def test_an_ack_by_a_master_after_a_newer_master_was_seen_is_split_brain() -> None:
    def at(t: float, seq: int, broker: str) -> Send:
        return attrs.evolve(send(t, seq), broker=broker)

    roles = [RoleSample(0.0, "n1", "sync_master", 1), RoleSample(0.0, "n2", "slave", 1),
             RoleSample(5.0, "n2", "sync_master", 2), RoleSample(6.0, "n1", "slave", 2)]
    events: list[Event] = [*roles, at(1.0, 0, "n1"), at(4.9, 1, "n1"), at(5.2, 2, "n1"), at(5.5, 3, "n2"),
                           at(5.7, 4, "n1")]
    result = check(events)
    assert result.stale_acks == (StaleAck("n1", 1, "p0-2", 5.21, "n2", 2, 5.0),
                                 StaleAck("n1", 1, "p0-4", 5.71, "n2", 2, 5.0))
    assert result.split_brain_s == pytest.approx(0.71)
    assert result.summary()["acked_by_deposed_master"] == 2
    windowed = check([*events, FaultWindow(4.5, 5.1, "suspend", 1, "n1")])
    assert windowed.faults[0].stale_acks == 2 and windowed.faults[0].split_brain_s == pytest.approx(0.71)
    assert check([*roles, at(4.9, 1, "n1"), at(5.5, 3, "n2")]).stale_acks == ()
    # n1 elected again (epoch 3) and acking before a sample showed it: not stale.
    again = [*events, RoleSample(9.0, "n1", "sync_master", 3), at(8.8, 5, "n1")]
    assert [a.body for a in check(again).stale_acks] == ["p0-2", "p0-4"]


def test_acks_counted_by_the_brokers_say_who_acked_whatever_broker_the_client_addressed() -> None:
    """Brokers that forward clients to their master report the sends they acked themselves, by
    epoch: a send addressed to a slave but acked by the master is not split brain; acks a broker
    counted under an old epoch after a newer master was seen are."""
    def at(t: float, seq: int, broker: str) -> Send:
        return attrs.evolve(send(t, seq), broker=broker)

    roles = [RoleSample(0.0, "n1", "sync_master", 1, {"1": 0}), RoleSample(0.0, "n2", "slave", 1, {}),
             RoleSample(3.0, "n1", "sync_master", 1, {"1": 2}),
             RoleSample(5.0, "n2", "sync_master", 2, {}), RoleSample(5.2, "n1", "sync_master", 1, {"1": 3}),
             RoleSample(6.0, "n1", "slave", 2, {"1": 5}), RoleSample(6.5, "n2", "sync_master", 2, {"2": 4})]
    # Every send addressed to n1 (the route's first address): n2, master since 5.0, acked the late ones.
    result = check([*roles, at(1.0, 0, "n1"), at(2.0, 1, "n1"), at(5.5, 2, "n1"), at(5.7, 3, "n1")])
    assert [(a.broker, a.epoch, a.acked_at, a.newer_since) for a in result.stale_acks] == [("n1", 1, 6.0, 5.0)] * 2
    assert result.split_brain_s == pytest.approx(1.0)  # an upper bound: the sample that showed the acks


def test_a_history_file_round_trips(tmp_path: Path) -> None:
    history = History(tmp_path / "history.jsonl")
    events = [*clean_history(), FaultWindow(1.0, 2.0, "kill", 1, "n1", "SIGKILL")]
    history.extend(events)
    history.close()
    assert load_history(tmp_path / "history.jsonl") == events
    (tmp_path / "bad.jsonl").write_text('{"kind": "send", "t0": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:1: not a chaos history event"):
        load_history(tmp_path / "bad.jsonl")
