"""cluster_zk's in-sync sets, claims and leases against a real ZooKeeper.

A master's connection to ZooKeeper runs through a loopback forwarder the test freezes (the master
cut off ZooKeeper only); sessions are expired from outside as ZooKeeper does to a silent owner.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")

from plugmq.chaos.forwarder import Forwarder
from plugmq.core import BrokerRegistration
from plugmq.core.contracts.cluster import Mastership
from plugmq.core.contracts.leadership import InSyncCluster, InSyncSet, Leadership
from plugmq.core.errors import ClusterError, FencedError
from plugmq.plugins.cluster_zk.options import ZkOptions
from plugmq.plugins.cluster_zk.service import ZkClusterService
from plugmq.testing import ZooKeeperServer, seconds_until, wait_for
from tests.test_cluster_zk import expire

BROKER = "broker-i"
WAIT_S = 20.0


class Node:
    """One broker's cluster service standing for master of ``BROKER``."""

    def __init__(self, hosts: str, cluster: str, broker_id: int, session_timeout_s: float = 2.0) -> None:
        self.broker_id = broker_id
        self.service = ZkClusterService(ZkOptions(hosts=hosts, session_timeout_s=session_timeout_s), cluster, BROKER)
        self.service.register(BrokerRegistration(cluster, BROKER, f"127.0.0.1:{10000 + broker_id}",
                                                 broker_id=broker_id))
        self.won: queue.SimpleQueue[Mastership | None] = queue.SimpleQueue()
        self.asked: list[InSyncSet | None] = []

    def stand(self, rule: Callable[[InSyncSet | None, int], bool]) -> None:
        def eligible(stored: InSyncSet | None) -> tuple[bool, str]:
            self.asked.append(stored)
            allowed = rule(stored, self.broker_id)
            return allowed, "member" if allowed else "not a member of the in-sync set"
        self.service.stand(self.won.put, eligible)

    def next_event(self, timeout_s: float = WAIT_S) -> Mastership | None:
        return self.won.get(timeout=timeout_s)

    def leadership(self, timeout_s: float = WAIT_S) -> Leadership:
        mastership = self.next_event(timeout_s)
        assert mastership is not None and mastership.leadership is not None
        return mastership.leadership


@pytest.fixture
def zk_link(zookeeper: ZooKeeperServer, nodes: list[Node]) -> Iterator[Forwarder]:
    """A forwarder to ZooKeeper the test freezes; the nodes close while it still carries their goodbye."""
    assert zookeeper.port is not None
    link = Forwarder("zk", ("127.0.0.1", zookeeper.port))
    yield link
    for node in nodes:
        node.service.close()
    link.stop()


def members_only(stored: InSyncSet | None, broker_id: int) -> bool:
    return stored is None or broker_id in stored.members


@pytest.fixture
def nodes(zookeeper: ZooKeeperServer) -> Iterator[list[Node]]:
    opened: list[Node] = []
    yield opened
    for node in opened:
        node.service.close()


def test_the_first_claim_writes_the_set_with_its_epoch_and_only_members_are_elected_after(
        zookeeper: ZooKeeperServer, nodes: list[Node]) -> None:
    cluster = f"i{uuid.uuid4().hex[:8]}"
    first = Node(zookeeper.hosts, cluster, 1)
    nodes.append(first)
    assert isinstance(first.service, InSyncCluster)
    first.stand(members_only)
    leadership = first.leadership()
    stored = first.service.in_sync_set(BROKER)
    assert stored is not None and (stored.epoch, stored.master, stored.members) == (leadership.epoch, 1, frozenset({1}))
    assert first.asked == [None] and leadership.holds()

    grown = leadership.change_in_sync(frozenset({1, 2}))
    assert grown.members == {1, 2} and first.service.in_sync_set(BROKER) == grown

    # Broker 3 is no member: it never claims, even with the master gone; broker 2 is and does.
    outsider = Node(zookeeper.hosts, cluster, 3)
    nodes.append(outsider)
    outsider.stand(members_only)
    first.service.close()
    assert not leadership.holds() and leadership.lost
    member = Node(zookeeper.hosts, cluster, 2)
    nodes.append(member)
    member.stand(members_only)
    successor = member.leadership()
    assert successor.epoch == leadership.epoch + 1
    assert member.service.in_sync_set(BROKER) == successor.in_sync()
    assert successor.in_sync().members == {2}, "a new master's set is itself until slaves catch up"
    wait_for(lambda: len(outsider.asked) >= 1, WAIT_S, "the outsider to win the lock once and let it go")
    assert outsider.won.empty() and all(stored is not None for stored in outsider.asked)


def test_a_master_cut_off_zookeeper_stops_holding_within_its_lease_and_its_writes_are_fenced_after_a_successor(
        zookeeper: ZooKeeperServer, nodes: list[Node], zk_link: Forwarder) -> None:
    cluster = f"i{uuid.uuid4().hex[:8]}"
    link = zk_link
    master = Node(link.address, cluster, 1)
    nodes.append(master)
    master.stand(members_only)
    leadership = master.leadership()
    leadership.change_in_sync(frozenset({1, 2}))
    lease_s = master.service.lease_s
    assert lease_s < 2.0

    link.freeze()
    frozen = time.monotonic()
    lapsed_s = seconds_until(lambda: not leadership.holds(), WAIT_S, "the lease to lapse")
    assert lapsed_s <= lease_s + 0.2, f"held {lapsed_s:.2f} s into the partition (lease {lease_s:.2f} s)"
    with pytest.raises(ClusterError):
        leadership.change_in_sync(frozenset({1}))  # a master cut off ZooKeeper cannot shrink its set

    # ZooKeeper expires the silent session; the member stands and claims.
    slave = Node(zookeeper.hosts, cluster, 2)
    nodes.append(slave)
    slave.stand(members_only)
    successor = slave.leadership()
    assert time.monotonic() - frozen >= 2.0 - 0.25, "elected only once the old session could have expired"
    assert not leadership.holds()

    link.heal()
    wait_for(lambda: leadership.lost, WAIT_S, "the old master to learn it lost")
    assert master.next_event() is None, "the broker is told it lost"
    with pytest.raises(FencedError):
        leadership.change_in_sync(frozenset({1}))
    assert slave.service.in_sync_set(BROKER) == successor.in_sync()


def test_a_short_partition_suspends_the_lease_and_the_same_session_resumes_it(
        nodes: list[Node], zk_link: Forwarder) -> None:
    cluster = f"i{uuid.uuid4().hex[:8]}"
    link = zk_link
    master = Node(link.address, cluster, 1, session_timeout_s=6.0)
    nodes.append(master)
    master.stand(members_only)
    leadership = master.leadership()
    session = master.service.client.client_id
    link.freeze()
    wait_for(lambda: not leadership.holds(), WAIT_S, "the lease to lapse")
    link.heal()
    wait_for(leadership.holds, WAIT_S, "the same session to renew the lease")
    assert master.service.client.client_id == session and not leadership.lost
    assert leadership.change_in_sync(frozenset({1, 2})).members == {1, 2}


def test_an_expired_session_loses_the_leadership_and_a_new_session_claims_a_newer_epoch(
        zookeeper: ZooKeeperServer, nodes: list[Node]) -> None:
    cluster = f"i{uuid.uuid4().hex[:8]}"
    master = Node(zookeeper.hosts, cluster, 1)
    nodes.append(master)
    master.stand(members_only)
    leadership = master.leadership()
    expire(master.service, zookeeper.hosts)
    wait_for(lambda: leadership.lost, WAIT_S, "the leadership to be lost with the session")
    assert not leadership.holds()
    assert master.next_event() is None
    again = master.leadership()  # still the only member: it stands again with the new session
    assert again.epoch == leadership.epoch + 1 and again.holds()
