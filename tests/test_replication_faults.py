"""What an ack means, under every fault (DESIGN.md section 12): real ZooKeeper, two failover
``plugmq serve`` children, the official Python client sending and receiving throughout.

Per fault class a couple of short rounds (``plugmq chaos`` runs the long schedules): kill -9 of the
master, repeated kills while the restarted broker still catches up, the master frozen (SIGSTOP)
past its session, the master cut off ZooKeeper only, master and slave cut off each other, and
ZooKeeper down. For ``sync_master`` the checker finds no acknowledged message lost, no message
delivered again after the client was told its ack succeeded, and no (queue, offset) that held two
messages; after a master dies the long-lived clients send and receive again within the session
timeout plus a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.testing import ZooKeeperServer, wait_for
from tests.fault_harness import Pair, Traffic, Verdict, run_faults, run_faults_traced, running_pair

pytestmark = pytest.mark.slow  # each test: two serve children and a few faults under load

SESSION_S = 2.0


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Pair]:
    with running_pair(tmp_path, zookeeper, mode="sync_master", session_timeout_s=SESSION_S) as made:
        yield made


@pytest.fixture
def async_pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Pair]:
    with running_pair(tmp_path, zookeeper, mode="async_master", session_timeout_s=SESSION_S) as made:
        yield made


def assert_kept(verdict: Verdict, traffic: Traffic | None = None, moments: list[float] | None = None) -> None:
    print(verdict.summary())
    assert verdict.acked > 0
    story = (lambda bodies: "\n" + verdict.story(traffic, bodies, moments or [])) if traffic is not None else (
        lambda bodies: "")
    assert not verdict.lost, f"acked messages lost: {sorted(verdict.lost)[:5]}{story(verdict.lost)}"
    assert not verdict.redelivered_after_ok_ack, (
        f"redelivered after an OK ack: {sorted(verdict.redelivered_after_ok_ack)[:5]}"
        f"{story(verdict.redelivered_after_ok_ack)}")
    assert not verdict.positions_with_two_messages, f"positions with two messages: {verdict.positions_with_two_messages}"


def _other_is_master(pair: Pair, i: int) -> bool:
    status = pair.status(1 - i)
    elected = bool(status) and status["role"] != "slave"  # type: ignore[index]
    if elected:
        pair.elections.append(time.monotonic())  # seen elected (no earlier than it was)
    return elected


def kill_9(pair: Pair, master: int) -> float:
    pair.kill(master)
    moment = time.monotonic()
    wait_for(lambda: _other_is_master(pair, master), 30, "the slave to be elected")
    pair.restart(master)  # back as a slave: it catches up and joins the in-sync set again
    return moment


def test_kill_9_of_the_master_loses_nothing_and_clients_are_back_within_the_session_timeout(pair: Pair) -> None:
    verdict, sends_back, receives_back = run_faults(pair, kill_9, rounds=2)
    print(f"sends back after {[round(s, 2) for s in sends_back]} s, receives after {[round(s, 2) for s in receives_back]} s")
    assert_kept(verdict)
    assert max(sends_back) <= SESSION_S + 1.0 and max(receives_back) <= SESSION_S + 1.0


def repeated_kill(pair: Pair, master: int) -> float:
    """The master dies; once the other took over, the old one restarts and, still catching up,
    sees the new master die too; then that one restarts. The restarted broker is not in the
    in-sync set until it caught up: it must not be elected before."""
    other = 1 - master
    pair.kill(master)
    moment = time.monotonic()
    wait_for(lambda: _other_is_master(pair, master), 30, "the slave to be elected")
    pair.restart(master)
    pair.kill(other)
    pair.restart(other)
    return moment


def test_repeated_kills_while_the_restarted_broker_catches_up_lose_nothing(pair: Pair) -> None:
    verdict, sends_back, _ = run_faults(pair, repeated_kill, rounds=1)
    print(f"sends back after {[round(s, 2) for s in sends_back]} s")
    assert_kept(verdict)


def pause_past_the_session(pair: Pair, master: int) -> float:
    """SIGSTOP of the master until the other broker was elected (its session expired), then SIGCONT."""
    pair.freeze(master)
    moment = time.monotonic()
    wait_for(lambda: _other_is_master(pair, master), 30, "the slave to be elected while the master is frozen")
    wait_for(lambda: time.monotonic() - moment >= 2 * SESSION_S, 30, "twice the session timeout")
    pair.thaw(master)
    return moment


def cut_off_zookeeper(pair: Pair, master: int) -> float:
    """The master loses ZooKeeper only (its clients and its slave still reach it) until the slave
    was elected, then the partition heals."""
    pair.zk_links[master].freeze()
    moment = time.monotonic()
    wait_for(lambda: _other_is_master(pair, master), 30, "the slave to be elected")
    pair.zk_links[master].heal()
    return moment


def cut_off_each_other(pair: Pair, master: int) -> float:
    """Master and slave lose each other (both still reach ZooKeeper and the clients) for two
    session timeouts: the master writes the slave out of the in-sync set and goes on alone."""
    for link in pair.ha_links:
        link.freeze()
    moment = time.monotonic()
    wait_for(lambda: time.monotonic() - moment >= 2 * SESSION_S, 30, "the partition to last")
    for link in pair.ha_links:
        link.heal()
    return moment


def test_a_paused_or_partitioned_master_never_acks_what_its_successor_lacks(pair: Pair) -> None:
    """One after the other: the master frozen past its session, the master cut off ZooKeeper
    only, master and slave cut off each other."""
    plan = [pause_past_the_session, cut_off_zookeeper, cut_off_each_other]
    verdict, sends_back, receives_back, traffic, moments = run_faults_traced(pair, plan)
    for fault, sent, received in zip(plan, sends_back, receives_back, strict=True):
        print(f"{fault.__name__}: sends back after {sent:.2f} s, receives after {received:.2f} s")
    assert_kept(verdict, traffic, moments)


def zookeeper_down(zookeeper: ZooKeeperServer) -> Callable[[Pair, int], float]:
    def fault(pair: Pair, master: int) -> float:
        """ZooKeeper stops for a session timeout and comes back on its port with its data."""
        del pair, master
        zookeeper.stop()
        moment = time.monotonic()
        wait_for(lambda: time.monotonic() - moment >= SESSION_S, 30, "ZooKeeper to stay down")
        zookeeper.start()
        return moment
    return fault


def test_zookeeper_down_stops_acks_and_they_resume_with_the_same_sessions(
        pair: Pair, zookeeper: ZooKeeperServer) -> None:
    verdict, sends_back, _ = run_faults(pair, zookeeper_down(zookeeper), rounds=1)
    print(f"sends back after {[round(s, 2) for s in sends_back]} s")
    assert_kept(verdict)


@pytest.mark.parametrize("fault", [kill_9, cut_off_zookeeper], ids=["kill-9", "cut-off-zookeeper"])
def test_an_async_master_loses_only_what_was_acked_before_its_successor_was_elected(
        async_pair: Pair, fault: Callable[[Pair, int], float]) -> None:
    """async_master acks before its slave has a message, so a fault may lose what the slave had not
    received; but no ack comes from a master once a newer one was elected (split-brain window 0),
    and consumers still never see a message again after its ack, nor two messages at one position."""
    verdict, sends_back, _, traffic, _ = run_faults_traced(async_pair, [fault])
    print(f"{fault.__name__}: {verdict.summary()}; sends back after {[round(s, 2) for s in sends_back]} s")
    acked_at = {body: at for at, body in traffic.acked}
    elected = min(async_pair.elections)  # one round: the successor was elected no later than this
    late = sorted(body for body in verdict.lost if acked_at[body] > elected)
    assert not late, f"lost messages acked after a newer master was elected: {late[:5]}"
    assert not verdict.redelivered_after_ok_ack and not verdict.positions_with_two_messages, verdict.summary()
