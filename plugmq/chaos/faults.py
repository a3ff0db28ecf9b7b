"""The faults a chaos run injects, named after OpenChaos's (in brackets where they differ).

Each fault picks its target, is injected, held for a while and healed:

* ``kill`` (random-kill): kill -9 of a random broker, restarted at the heal;
* ``kill-master`` (leader-kill): kill -9 of whoever is master now, restarted at the heal; the next
  round does not wait for recovery, so it kills the master again while the restarted one may
  still be catching up (the last round is followed by the recovery wait);
* ``suspend`` (leader-suspend): SIGSTOP of the master for ``k`` session timeouts, then SIGCONT;
* ``partition-zk``: the master cut off ZooKeeper only (its ZooKeeper forwarder frozen); clients
  and its slaves still reach it;
* ``partition-pair``: master and slaves cut off each other (their ha forwarders frozen);
* ``loss`` (random-loss): the master's links lose chunks (each held one retransmission timeout);
* ``delay``: the master's links add latency;
* ``zk-down``: the ZooKeeper process killed (SIGKILL), then restarted on its data directory.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable

import attrs

from plugmq.chaos.cluster import BrokerNode, ChaosCluster
from plugmq.chaos.forwarder import Forwarder, LinkState
from plugmq.core.errors import ConfigError

__all__ = ["FAULTS", "Fault", "Injected", "fault_named"]

#: How long a fault lasts, in session timeouts (a master frozen twice its session is surely replaced).
SUSPEND_SESSIONS = 2.0
PARTITION_SESSIONS = 3.0
DOWN_SESSIONS = 2.0
LOSS = LinkState(loss=0.2, retransmit_s=0.2)
DELAY = LinkState(delay_s=0.1)


@attrs.frozen
class Injected:
    """A fault as injected: what it hit, and how to heal it."""

    target: str
    detail: str
    heal: Callable[[], None]


@attrs.frozen
class Fault:
    """A named fault: ``inject`` it on a cluster, hold it ``hold_sessions`` session timeouts, heal."""

    name: str
    openchaos: str
    hold_sessions: float
    inject: Callable[[ChaosCluster, random.Random], Injected]
    needs_ha_link: bool = False
    #: Wait after the heal for the cluster to settle and the clients to be served before the next
    #: round. kill-master does not: it strikes again ``steady`` seconds after the last master came
    #: back, while that one may still be catching up (the repeated crash that loses most).
    awaits_recovery: bool = True


def _master_or_fail(cluster: ChaosCluster) -> BrokerNode:
    master = cluster.master()
    if master is None:
        raise RuntimeError("no master to inject the fault on (the cluster did not recover from the last round)")
    return master


def _kill(node: BrokerNode, cluster: ChaosCluster) -> Injected:
    cluster.kill(node)
    return Injected(node.name, "SIGKILL, restarted at the heal", lambda: cluster.start_broker(node))


def _kill_random(cluster: ChaosCluster, rng: random.Random) -> Injected:
    return _kill(rng.choice(cluster.nodes), cluster)


def _kill_master(cluster: ChaosCluster, rng: random.Random) -> Injected:
    return _kill(_master_or_fail(cluster), cluster)


def _suspend(cluster: ChaosCluster, rng: random.Random) -> Injected:
    node = _master_or_fail(cluster)
    cluster.suspend(node)
    return Injected(node.name, f"SIGSTOP for {SUSPEND_SESSIONS:g} session timeouts, then SIGCONT",
                    lambda: cluster.resume(node))


def _on_links(name: str, detail: str, links: list[Forwarder], state: LinkState) -> Injected:
    for link in links:
        link.set_state(state)

    def heal() -> None:
        for link in links:
            link.heal()

    return Injected(name, f"{detail} ({', '.join(link.name for link in links)})", heal)


def _partition_zk(cluster: ChaosCluster, rng: random.Random) -> Injected:
    node = _master_or_fail(cluster)
    return _on_links(node.name, "cut off ZooKeeper only", [node.zookeeper], LinkState(frozen=True))


def _partition_pair(cluster: ChaosCluster, rng: random.Random) -> Injected:
    links = [node.ha for node in cluster.nodes if node.ha is not None]
    return _on_links(_master_or_fail(cluster).name, "master and slaves cut off each other", links,
                     LinkState(frozen=True))


def _master_links(cluster: ChaosCluster) -> tuple[BrokerNode, list[Forwarder]]:
    node = _master_or_fail(cluster)
    return node, node.forwarders()


def _loss(cluster: ChaosCluster, rng: random.Random) -> Injected:
    node, links = _master_links(cluster)
    return _on_links(node.name, f"{LOSS.loss:.0%} of chunks held {LOSS.retransmit_s:g} s", links, LOSS)


def _delay(cluster: ChaosCluster, rng: random.Random) -> Injected:
    node, links = _master_links(cluster)
    return _on_links(node.name, f"{DELAY.delay_s * 1000:g} ms added each way", links, DELAY)


def _zk_down(cluster: ChaosCluster, rng: random.Random) -> Injected:
    cluster.zookeeper.stop(signal.SIGKILL)

    def restart() -> None:
        cluster.zookeeper.start()

    return Injected("zookeeper", "SIGKILL, restarted on its data directory at the heal", restart)


FAULTS: dict[str, Fault] = {fault.name: fault for fault in (
    Fault("kill", "random-kill", DOWN_SESSIONS, _kill_random),
    Fault("kill-master", "leader-kill", DOWN_SESSIONS, _kill_master, awaits_recovery=False),
    Fault("suspend", "leader-suspend", SUSPEND_SESSIONS, _suspend),
    Fault("partition-zk", "fixed-partition (broker / ZooKeeper)", PARTITION_SESSIONS, _partition_zk),
    Fault("partition-pair", "fixed-partition (master / slave)", PARTITION_SESSIONS, _partition_pair,
          needs_ha_link=True),
    Fault("loss", "random-loss", PARTITION_SESSIONS, _loss),
    Fault("delay", "random-delay", PARTITION_SESSIONS, _delay),
    Fault("zk-down", "kill of the name service", DOWN_SESSIONS, _zk_down),
)}
_ALIASES = {fault.openchaos: name for name, fault in FAULTS.items()}


def fault_named(name: str) -> Fault:
    """The fault called ``name`` (or its OpenChaos name); ConfigError listing the known ones."""
    fault = FAULTS.get(name) or FAULTS.get(_ALIASES.get(name, ""))
    if fault is None:
        raise ConfigError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return fault
