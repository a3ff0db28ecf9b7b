"""The ha master's in-sync set and commit point rules (plugmq.plugins.ha.insync), driven directly.

The log end is a number the test moves; slaves are broker ids whose confirmations the test
reports; the leadership is the core's LocalLeadership (the set a master without failover keeps).
Waits poll real state with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from plugmq.core import SendStatus
from plugmq.core.contracts.leadership import LocalLeadership
from plugmq.core.errors import FencedError
from plugmq.plugins.ha.insync import InSync
from plugmq.testing import WAIT_S, wait_for

MIB = 1 << 20


class Log:
    def __init__(self) -> None:
        self.end = 0


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
def in_sync(log: Log) -> Iterator[InSync]:
    made = InSync(LocalLeadership(0), me=0, log_end=lambda: log.end, min_in_sync=1, max_lag_s=0.3,
                  join_gap_bytes=MIB, broker_name="broker-r")
    yield made
    made.close()


def test_a_slave_joins_only_holding_what_was_committed_before_it_and_is_required_from_then_on(
        log: Log, in_sync: InSync) -> None:
    log.end = 10 * MIB
    in_sync.connected(1, 0)
    assert in_sync.commit_point() == 10 * MIB, "alone, the master's end is committed"
    in_sync.confirmed(1, 8 * MIB)  # 2 MiB behind: not yet
    assert in_sync.required() == {0}
    in_sync.confirmed(1, 9 * MIB + 1)  # within the join gap: required from now on, written once it holds 10 MiB
    wait_for(lambda: 1 in in_sync.required(), WAIT_S, "the slave to be required")
    assert in_sync.members == {0}, "not in the set before it holds what was committed when it joined"
    log.end = 11 * MIB  # a send the master stored after the join waits for the slave
    assert in_sync.commit_point() == 10 * MIB
    in_sync.confirmed(1, 10 * MIB)
    wait_for(lambda: in_sync.members == {0, 1}, WAIT_S, "the slave to be written into the set")
    assert in_sync.commit_point() == 10 * MIB
    in_sync.confirmed(1, 11 * MIB)
    assert in_sync.commit_point() == 11 * MIB


def test_a_sync_send_is_acked_once_every_member_holds_it(log: Log, in_sync: InSync) -> None:
    log.end = 100
    in_sync.connected(1, 100)
    wait_for(lambda: in_sync.members == {0, 1}, WAIT_S, "the slave to join")
    log.end = 200
    answers: list[SendStatus] = []
    waiter = threading.Thread(target=lambda: answers.append(in_sync.await_commit(200, 5.0, sync=True)))
    waiter.start()
    in_sync.confirmed(1, 150)
    waiter.join(0.1)
    assert not answers, "half of it confirmed is not enough"
    in_sync.confirmed(1, 200)
    waiter.join(5)
    assert answers == [SendStatus.SEND_OK]


def test_a_member_that_stops_confirming_leaves_and_the_commit_point_never_goes_back(
        log: Log, in_sync: InSync) -> None:
    log.end = 100
    in_sync.connected(1, 100)
    wait_for(lambda: in_sync.members == {0, 1}, WAIT_S, "the slave to join")
    log.end = 300
    in_sync.sent(1, 300)
    assert in_sync.commit_point() == 100
    wait_for(lambda: in_sync.members == {0}, WAIT_S, "the silent member to leave after max_lag_s")
    assert in_sync.commit_point() == 300
    in_sync.connected(1, 50)  # back, holding less: it catches up before it counts again
    assert in_sync.commit_point() == 300
    assert in_sync.members == {0}


def test_a_slave_back_holding_less_than_it_confirmed_leaves_the_set(log: Log, in_sync: InSync) -> None:
    log.end = 100
    in_sync.connected(1, 100)
    wait_for(lambda: in_sync.members == {0, 1}, WAIT_S, "the slave to join")
    in_sync.connected(1, 60)  # it lost what it had confirmed (a crash without sync flush)
    wait_for(lambda: in_sync.members == {0}, WAIT_S, "the slave to leave")


def test_min_in_sync_replicas_refuses_sends_before_they_are_stored(log: Log) -> None:
    strict = InSync(LocalLeadership(0), me=0, log_end=lambda: log.end, min_in_sync=2, max_lag_s=0.3,
                    join_gap_bytes=MIB, broker_name="broker-r")
    try:
        assert strict.admit(sync=True) is SendStatus.SLAVE_NOT_AVAILABLE
        assert strict.admit(sync=False) is SendStatus.SEND_OK, "min_in_sync_replicas bounds sync sends only"
        strict.connected(1, 0)
        wait_for(lambda: strict.admit(sync=True) is SendStatus.SEND_OK, WAIT_S, "the slave to join")
        assert strict.await_committed(0, 1.0), "consumer state needs the commit point, not two members"
    finally:
        strict.close()


def test_a_lost_leadership_refuses_sends_and_answers_waiting_ones(log: Log) -> None:
    leadership = LocalLeadership(0)
    lost = InSync(leadership, me=0, log_end=lambda: log.end, min_in_sync=1, max_lag_s=0.3, join_gap_bytes=MIB,
                  broker_name="broker-r")
    try:
        log.end = 100
        lost.connected(1, 0)
        leadership.end()
        with pytest.raises(FencedError):
            lost.admit(sync=False)
        with pytest.raises(FencedError):
            lost.await_commit(100, 1.0, sync=False)
    finally:
        lost.close()
