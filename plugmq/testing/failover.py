"""Failover on one machine for tests and ``plugmq bench failover``: two ``plugmq serve`` children of
one broker name (``[broker] failover = true``, the ha and cluster_zk plugins) on a real ZooKeeper.

:func:`run_kill` sends from producer threads of the official Python client to the elected master,
kills it with SIGKILL, times until the other broker takes sends as the new master, reads back what
it holds, restarts the old master and waits until it follows the new one: a :class:`KillRun`.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import attrs

from plugmq.testing.cluster import CLUSTER_PLUGINS, ServeProcess, broker_status, status_or_none
from plugmq.testing.wait import seconds_until, wait_for
from plugmq.testing.zookeeper import ZooKeeperServer

__all__ = ["FAILOVER_PLUGINS", "KillRun", "PauseRun", "RestartRun", "UncleanRun", "read_all", "read_until_held", "run_kill",
           "run_pause", "run_restart_all", "run_unclean", "write_failover_config"]

FAILOVER_PLUGINS = [*CLUSTER_PLUGINS, "ha"]
TOPIC = "FailoverTopic"
#: More than loopback TCP buffers hold for a reader that stopped reading (they grow with its pace).
_BEYOND_SOCKET_BUFFERS = 16 << 20
BROKER = "broker-f"


def write_failover_config(directory: Path, data_dir: str, broker_id: int, *, mode: str, zookeeper: str,
                          cluster: str, session_timeout_s: float = 2.0, unclean_after_s: float = 0.0) -> Path:
    """A ``plugmq serve`` TOML for broker ``broker-f`` (id ``broker_id``) standing for master in ``mode``."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{data_dir}.toml"
    config.write_text(
        f'[broker]\nname = "{BROKER}"\ndata_dir = "{data_dir}"\nbroker_id = {broker_id}\nrole = "{mode}"\n'
        f"failover = true\nfailover_unclean_after_s = {unclean_after_s}\nplugins = {json.dumps(FAILOVER_PLUGINS)}\n"
        f'[cluster]\nname = "{cluster}"\n'
        f'[plugins.cluster_zk]\nhosts = "{zookeeper}"\nsession_timeout_s = {session_timeout_s}\n'
        "[plugins.ha]\nheartbeat_ms = 100\npeer_timeout_ms = 3000\nreconnect_ms = 20\nreconnect_max_ms = 200\n"
        "sync_timeout_ms = 3000\nmin_in_sync_replicas = 1\n"
        "[server]\nlong_polling_s = 1\n", encoding="utf-8")
    return config


@attrs.frozen
class KillRun:
    """One kill -9 of the master. ``acked``: bodies the producers got SEND_OK for; ``held``: bodies
    the new master holds (read until it had every acked one, if it does); ``last_lag_messages``:
    the lag the old master last reported (messages) and ``acked_after_report`` the sends acked
    after that report (both bound an async loss)."""

    mode: str
    failover_s: float  # kill -> a send straight to the other broker succeeds
    routed_s: float  # kill -> the official producer (routed afresh) sends to it
    steady_rate: float
    acked: frozenset[bytes]
    held: frozenset[bytes]
    last_lag_messages: int
    acked_after_report: int
    old_epoch: int
    new_epoch: int
    rejoined: dict[str, Any]
    errors: tuple[str, ...]

    @property
    def lost(self) -> frozenset[bytes]:
        return self.acked - self.held


class _Senders:
    """Producer threads of the official client sending unique bodies to ``address``."""

    def __init__(self, address: str, threads: int) -> None:
        from rocketmq import ClientConfiguration, Credentials, Producer

        self.producer = Producer(ClientConfiguration(address, Credentials(), request_timeout=3), (TOPIC,))
        self.producer.startup()
        self._lock = threading.Lock()
        self.acked: list[tuple[float, bytes]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _send(self, index: int) -> None:
        from rocketmq import Message

        sequence = 0
        while not self._stop.is_set():
            message = Message()
            message.topic = TOPIC
            message.body = f"t{index}-{sequence}".encode()
            sequence += 1
            try:
                self.producer.send(message)
            except Exception as exc:  # noqa: BLE001 - a failed send is what is counted here
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:160])
                time.sleep(0.01)
                continue
            with self._lock:
                self.acked.append((time.monotonic(), message.body))

    def stop_soon(self) -> None:
        """No new sends; those under way finish (or time out) in the background."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.producer.shutdown()


def _send_one(address: str) -> bool:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(address, Credentials(), request_timeout=2), (TOPIC,))
    try:
        producer.startup()
        message = Message()
        message.topic = TOPIC
        message.body = b"probe-" + uuid.uuid4().hex.encode()
        producer.send(message)
        return True
    except Exception:  # noqa: BLE001 - not yet a master: try again
        return False
    finally:
        try:
            producer.shutdown()
        except Exception:  # noqa: BLE001 - a producer that never started may refuse to shut down
            pass


def read_all(address: str, group: str, topic: str = TOPIC) -> set[bytes]:
    """Every body of ``topic`` the broker name at ``address`` holds, read by ``group`` (a fresh group
    reads from the first offset) with the official client, until three receives come back empty.

    Nothing is acked: the group is this read's alone and a received message stays invisible for the
    60 s the read has (a second delivery would only be added to the set again); an ack per message
    took two thirds of the read's time."""
    return read_until_held(address, group, frozenset(), topic, stop_early=False)


def read_until_held(address: str, group: str, wanted: AbstractSet[bytes], topic: str = TOPIC, *,
                    stop_early: bool = True) -> set[bytes]:
    """:func:`read_all`'s read, which stops as soon as every body of ``wanted`` was read: a check
    of what was lost from ``wanted`` then knows it is nothing, and the three empty receives (three
    long polls) would only add idle time. Short of that it reads until three come back empty."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(address, Credentials(), request_timeout=3), group,
                              {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    held: set[bytes] = set()
    empty = 0
    try:
        while empty < 3:
            batch = consumer.receive(32, 60)
            empty = 0 if batch else empty + 1
            held.update(bytes(received.body) for received in batch)
            if stop_early and held >= wanted:
                break
    finally:
        consumer.shutdown()
    return held


def run_kill(directory: Path, zookeeper: ZooKeeperServer, *, mode: str, threads: int = 8, steady_s: float = 2.0,
             session_timeout_s: float = 2.0, wait_s: float = 60.0) -> KillRun:
    """Two brokers, sends, kill -9 of the master, the new master, the old one back as a slave."""
    cluster = f"f{uuid.uuid4().hex[:8]}"
    configs = [write_failover_config(directory, f"n{i}", i, mode=mode, zookeeper=zookeeper.hosts, cluster=cluster,
                                     session_timeout_s=session_timeout_s) for i in (1, 2)]
    processes = [ServeProcess(config) for config in configs]
    senders: _Senders | None = None
    try:
        addresses = [p.await_address() for p in processes]
        statuses: dict[str, dict[str, Any] | None] = {}

        def settled() -> bool:
            for address in addresses:
                statuses[address] = status_or_none(address)
            roles = sorted(str((s or {}).get("role")) for s in statuses.values())
            slave = next((s for s in statuses.values() if s and s["role"] == "slave"), None)
            return roles == sorted([mode, "slave"]) and slave is not None and slave["replication"]["connected"]

        wait_for(settled, wait_s, "one master and a connected slave")
        master_index = next(i for i, a in enumerate(addresses) if (statuses[a] or {}).get("role") == mode)
        master, survivor = addresses[master_index], addresses[1 - master_index]
        old_epoch = int((statuses[master] or {})["epoch"])
        senders = _Senders(master, threads)
        time.sleep(steady_s)
        report = broker_status(master)  # what the master says just before it dies
        reported_at = time.monotonic()
        slaves = report["replication"]["slaves"]
        last_lag = int(slaves[0]["lag_messages"] or 0) if slaves else 0
        processes[master_index].stop(signal.SIGKILL)
        killed = time.monotonic()
        with senders._lock:
            steady = [t for t, _ in senders.acked]
        steady_rate = len(steady) / max(1e-9, (steady[-1] - steady[0])) if len(steady) > 1 else 0.0
        failover_s = seconds_until(lambda: _taken(survivor), wait_s, "the survivor to take sends as master")
        routed_s = failover_s + seconds_until(lambda: _send_one(survivor), wait_s,
                                              "the official producer's send to the new master")
        del killed
        senders.stop()
        acked = frozenset(body for _, body in senders.acked)
        acked_after = sum(1 for t, _ in senders.acked if t > reported_at)
        errors = tuple(sorted(set(senders.errors)))
        senders = None
        new_epoch = int(broker_status(survivor)["epoch"])
        # Only what was lost from ``acked`` is asked of ``held``: the read ends once it has all of it.
        held = frozenset(b for b in read_until_held(survivor, f"check-{uuid.uuid4().hex[:6]}", acked)
                         if not b.startswith(b"probe-"))

        processes[master_index] = ServeProcess(configs[master_index])
        returned = processes[master_index].await_address()
        rejoined: dict[str, Any] = {}

        def following() -> bool:
            status = status_or_none(returned)
            mine = status_or_none(survivor)
            if status is None or mine is None:
                return False
            rejoined.update(status)
            replication = status["replication"]
            return (status["role"] == "slave" and replication["connected"]
                    and replication["end_offset"] == mine["replication"]["end_offset"])

        wait_for(following, wait_s, "the old master to rejoin as a caught-up slave")
        return KillRun(mode, failover_s, routed_s, steady_rate, acked, held, last_lag, acked_after, old_epoch, new_epoch,
                       dict(rejoined), errors)
    finally:
        if senders is not None:
            senders.stop()
        for process in processes:
            process.stop(signal.SIGTERM)


@attrs.frozen
class PauseRun:
    """The master frozen (SIGSTOP) until its ZooKeeper session expired, with a tail its slave never
    got; then thawed (SIGCONT) while the other broker is master under a newer epoch."""

    old_end: int  # the old master's log end just before it froze (beyond what its slave held)
    slave_end: int  # what the slave held then: the new master's history begins there
    failover_s: float  # freeze -> the other broker takes a send (straight to it)
    demoted_s: float  # thaw -> the old master reports itself a slave
    rejoined: dict[str, Any]  # its broker-status once it follows the new master, caught up
    new_master: dict[str, Any]  # the new master's broker-status then
    stale_write_refused: bool  # a send straight to the thawed old master failed
    cut_logged: bool  # the new master logged that the returning one cut its log back


def _send_direct(address: str, timeout_s: float = 3.0, body: bytes | None = None) -> bool:
    """One send to the broker at ``address`` itself (its own route, not the cluster's)."""
    import grpc

    from plugmq.server.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc

    request = service_pb2.SendMessageRequest()
    message = request.messages.add()
    message.topic.name = TOPIC
    message.body = body if body is not None else b"probe-" + uuid.uuid4().hex.encode()
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = definition_pb2.MessageType.NORMAL
    message.system_properties.body_encoding = definition_pb2.Encoding.IDENTITY
    message.system_properties.queue_id = 0
    with grpc.insecure_channel(address) as channel:
        response = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(request, timeout=timeout_s)
    return response.status.code == Code.OK and all(e.status.code == Code.OK for e in response.entries)


def _taken(address: str) -> bool:
    try:
        return _send_direct(address, timeout_s=0.5)
    except Exception:  # noqa: BLE001 - not answering yet
        return False


def run_pause(directory: Path, zookeeper: ZooKeeperServer, *, session_timeout_s: float = 2.0,
              wait_s: float = 60.0) -> PauseRun:
    """async_master: the slave frozen for a moment (the master acks what it never gets), then the
    master frozen past its session timeout; the slave is elected; the old master thawed."""
    cluster = f"p{uuid.uuid4().hex[:8]}"
    configs = [write_failover_config(directory, f"n{i}", i, mode="async_master", zookeeper=zookeeper.hosts,
                                     cluster=cluster, session_timeout_s=session_timeout_s) for i in (1, 2)]
    processes = [ServeProcess(config) for config in configs]
    senders: _Senders | None = None
    frozen: list[ServeProcess] = []
    try:
        addresses = [p.await_address() for p in processes]

        def roles() -> dict[str, str]:
            return {a: str((status_or_none(a) or {}).get("role")) for a in addresses}

        wait_for(roles, wait_s, "one master and a slave",
                 until=lambda now: sorted(now.values()) == ["async_master", "slave"])
        now = roles()
        m = next(i for i, a in enumerate(addresses) if now[a] == "async_master")
        master, slave = addresses[m], addresses[1 - m]
        wait_for(lambda: bool((status_or_none(slave) or {}).get("replication", {}).get("connected")), wait_s,
                 "the slave to connect")
        senders = _Senders(master, 2)
        time.sleep(0.5)
        wait_for(lambda: (status_or_none(slave) or {}).get("replication", {}).get("end_offset", 0), wait_s,
                 "the slave to hold something", until=lambda end: end > 0)
        # Freeze the slave well inside its session timeout: the master acks what it never gets.
        processes[1 - m].send_signal(signal.SIGSTOP)
        frozen.append(processes[1 - m])
        frozen_at = time.monotonic()
        at_freeze = int(broker_status(master)["replication"]["end_offset"])
        # What the master streams into the socket still reaches the slave when it thaws (the kernel
        # buffers it): write more than those buffers hold, so the master surely has records its slave
        # never gets - well inside the slave's session, which must not expire while it is frozen.
        bulk = b"b" * (1 << 20)
        while int(broker_status(master)["replication"]["end_offset"]) < at_freeze + _BEYOND_SOCKET_BUFFERS:
            if time.monotonic() - frozen_at > session_timeout_s / 2:
                break
            _send_direct(master, body=bulk)
        time.sleep(max(0.0, min(0.6, session_timeout_s / 3) - (time.monotonic() - frozen_at)))
        old_end = int(broker_status(master)["replication"]["end_offset"])
        processes[m].send_signal(signal.SIGSTOP)
        frozen.append(processes[m])
        processes[1 - m].send_signal(signal.SIGCONT)
        frozen.remove(processes[1 - m])
        paused = time.monotonic()
        senders.stop_soon()  # their sends to the frozen master time out in the background
        slave_end = int(broker_status(slave)["replication"]["end_offset"])
        wait_for(lambda: _taken(slave), wait_s, "the slave to take sends as master")
        failover_s = time.monotonic() - paused
        wait_for(lambda: _send_one(slave), wait_s, "the official producer's send to the new master")
        # The old master's end as it froze: what its own store holds (read at the thaw below).
        processes[m].send_signal(signal.SIGCONT)
        frozen.remove(processes[m])
        demoted_s = seconds_until(lambda: (status_or_none(master) or {}).get("role") == "slave", wait_s,
                                  "the thawed master to step down")
        try:
            refused = not _send_direct(master)
        except Exception:  # noqa: BLE001 - an RPC error is a refusal too
            refused = True
        rejoined: dict[str, Any] = {}
        new_master: dict[str, Any] = {}

        def following() -> bool:
            status, mine = status_or_none(master), status_or_none(slave)
            if status is None or mine is None:
                return False
            rejoined.clear()
            rejoined.update(status)
            new_master.clear()
            new_master.update(mine)
            return (status["role"] == "slave" and status["replication"]["connected"]
                    and status["replication"]["end_offset"] == mine["replication"]["end_offset"])

        wait_for(following, wait_s, "the old master to follow the new one, caught up")
        cut = "diverged from this master" in processes[1 - m].log_path.read_text("utf-8", errors="replace")
        return PauseRun(old_end, slave_end, failover_s, demoted_s, dict(rejoined), dict(new_master), refused, cut)
    finally:
        for process in frozen:
            process.process.send_signal(signal.SIGCONT)
        if senders is not None:
            senders.stop()
        for process in processes:
            process.stop(signal.SIGTERM)


@attrs.frozen
class RestartRun:
    """Both brokers killed (the slave first), then both restarted: who is master again."""

    old_master_id: int
    new_master_id: int
    old_epoch: int
    new_epoch: int
    held_before: int  # the old master's log end when it was killed
    held_after: int  # the new master's log end once both run again
    elected_s: float  # restart -> a master with a connected slave


def _no_broker_registered(zookeeper: ZooKeeperServer, cluster: str, wait_s: float) -> None:
    """Wait until ZooKeeper holds no broker registration of ``cluster``: it ended the sessions of
    its killed brokers (a session's ephemeral nodes go with it at once)."""
    from kazoo.client import KazooClient

    from plugmq.plugins.cluster_zk.options import ZkOptions
    from plugmq.plugins.cluster_zk.paths import ZkPaths

    brokers = ZkPaths(ZkOptions(hosts=zookeeper.hosts).chroot, cluster).brokers
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=wait_s)
    try:
        wait_for(lambda: not client.get_children(brokers), wait_s, f"ZooKeeper to end the sessions of {cluster}'s "
                 "killed brokers", interval=0.05)
    finally:
        client.stop()
        client.close()


def _kill_slave_then_master(processes: list[ServeProcess], addresses: list[str], m: int, sends: int,
                            zookeeper: ZooKeeperServer, cluster: str, wait_s: float) -> int:
    """kill -9 of the slave, ``sends`` acked sends it never gets, kill -9 of the master (``m``), and
    the wait until both sessions are gone; returns the master's log end when it was killed."""
    processes[1 - m].stop(signal.SIGKILL)
    for _ in range(sends):
        assert _send_direct(addresses[m])  # acked, never replicated
    held_before = int(broker_status(addresses[m])["replication"]["end_offset"])
    processes[m].stop(signal.SIGKILL)
    _no_broker_registered(zookeeper, cluster, wait_s)  # nobody of the name is alive
    return held_before


def run_restart_all(directory: Path, zookeeper: ZooKeeperServer, *, session_timeout_s: float = 2.0,
                    wait_s: float = 60.0) -> RestartRun:
    """async_master: sends, kill -9 of the slave, more sends, kill -9 of the master; both restarted
    together. Neither is caught up with a live master then: the one that led the newest epoch
    stands, so the acked tail the slave never got is kept."""
    cluster = f"r{uuid.uuid4().hex[:8]}"
    configs = [write_failover_config(directory, f"n{i}", i, mode="async_master", zookeeper=zookeeper.hosts,
                                     cluster=cluster, session_timeout_s=session_timeout_s) for i in (1, 2)]
    processes = [ServeProcess(config) for config in configs]
    try:
        addresses = [p.await_address() for p in processes]

        def roles() -> dict[str, dict[str, Any] | None]:
            return {a: status_or_none(a) for a in addresses}

        def settled() -> bool:
            now = roles()
            kinds = sorted(str((s or {}).get("role")) for s in now.values())
            return kinds == ["async_master", "slave"] and all(
                s is not None and s["replication"]["connected"] for s in now.values())

        wait_for(settled, wait_s, "one master and a connected slave")
        now = roles()
        m = next(i for i, a in enumerate(addresses) if (now[a] or {}).get("role") == "async_master")
        old_epoch = int((now[addresses[m]] or {})["epoch"])
        for _ in range(20):
            assert _send_direct(addresses[m])
        held_before = _kill_slave_then_master(processes, addresses, m, 20, zookeeper, cluster, wait_s)
        processes = [ServeProcess(config) for config in configs]
        restarted = time.monotonic()
        addresses = [p.await_address() for p in processes]
        wait_for(settled, wait_s, "a master and a connected slave after the restart")
        elected_s = time.monotonic() - restarted
        now = roles()
        n = next(i for i, a in enumerate(addresses) if (now[a] or {}).get("role") == "async_master")
        master = now[addresses[n]] or {}
        return RestartRun(m + 1, n + 1, old_epoch, int(master["epoch"]), held_before,
                          int(master["replication"]["end_offset"]), elected_s)
    finally:
        for process in processes:
            process.stop(signal.SIGTERM)


@attrs.frozen
class UncleanRun:
    """The master lost for good while its slave lagged: the slave restarted alone, elected uncleanly."""

    held_before: int  # the old master's log end when it was killed
    slave_end: int  # the slave's log end when it was killed (what the new master starts from)
    elected_s: float  # the slave's restart -> it takes sends as master
    new_end: int  # the new master's log end after one more send
    epoch: int
    lost_logged: bool  # the new master said it lacks acked records
    rejoined: dict[str, Any]  # the old master's status once it follows, caught up


def run_unclean(directory: Path, zookeeper: ZooKeeperServer, *, unclean_after_s: float,
                session_timeout_s: float = 2.0, wait_s: float = 60.0) -> UncleanRun:
    """async_master: kill -9 of the slave, sends it never gets, kill -9 of the master; only the slave
    restarts. It is not caught up and was never master, so only ``failover_unclean_after_s`` lets it
    stand; then the old master returns and is cut back to the new master's log."""
    cluster = f"u{uuid.uuid4().hex[:8]}"
    configs = [write_failover_config(directory, f"n{i}", i, mode="async_master", zookeeper=zookeeper.hosts,
                                     cluster=cluster, session_timeout_s=session_timeout_s,
                                     unclean_after_s=unclean_after_s) for i in (1, 2)]
    processes = [ServeProcess(config) for config in configs]
    try:
        addresses = [p.await_address() for p in processes]

        def settled() -> bool:
            now = [status_or_none(a) for a in addresses]
            return sorted(str((s or {}).get("role")) for s in now) == ["async_master", "slave"] and all(
                s is not None and s["replication"]["connected"] for s in now)

        wait_for(settled, wait_s, "one master and a connected slave")
        m = next(i for i, a in enumerate(addresses) if (status_or_none(a) or {}).get("role") == "async_master")
        for _ in range(10):
            assert _send_direct(addresses[m])
        wait_for(lambda: (status_or_none(addresses[1 - m]) or {}).get("replication", {}).get("end_offset"), wait_s,
                 "the slave to catch up",
                 until=lambda end: end == broker_status(addresses[m])["replication"]["end_offset"])
        slave_end = int(broker_status(addresses[1 - m])["replication"]["end_offset"])
        held_before = _kill_slave_then_master(processes, addresses, m, 10, zookeeper, cluster, wait_s)
        processes[1 - m] = ServeProcess(configs[1 - m])
        restarted = time.monotonic()
        addresses[1 - m] = processes[1 - m].await_address()
        wait_for(lambda: _taken(addresses[1 - m]), wait_s,
                 "the lagging slave to take sends after an unclean election")
        elected_s = time.monotonic() - restarted
        status = broker_status(addresses[1 - m])
        lost_logged = "becoming master without the last master's whole log" in processes[1 - m].log_path.read_text(
            "utf-8", errors="replace")
        processes[m] = ServeProcess(configs[m])
        addresses[m] = processes[m].await_address()
        rejoined: dict[str, Any] = {}

        def following() -> bool:
            old, new = status_or_none(addresses[m]), status_or_none(addresses[1 - m])
            if old is None or new is None:
                return False
            rejoined.clear()
            rejoined.update(old)
            return (old["role"] == "slave" and old["replication"]["connected"]
                    and old["replication"]["end_offset"] == new["replication"]["end_offset"])

        wait_for(following, wait_s, "the old master to follow the new one, cut back")
        return UncleanRun(held_before, slave_end, elected_s, int(status["replication"]["end_offset"]),
                          int(status["epoch"]), lost_logged, dict(rejoined))
    finally:
        for process in processes:
            process.stop(signal.SIGTERM)
