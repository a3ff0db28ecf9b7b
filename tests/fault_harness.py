"""Faults under load for the replication tests: two failover brokers, the official Python client, a checker.

:class:`Pair` runs two ``plugmq serve`` children of one broker name (``failover = true``, ha and
cluster_zk) on a real ZooKeeper. Each broker reaches ZooKeeper through a loopback forwarder of its
own and is reached by its slaves through another (its ha ``advertise`` address), so a test can cut
one broker off ZooKeeper, or master and slave off each other, by freezing forwarders; kill -9 and
SIGSTOP act on the children themselves.

:class:`Traffic` drives the official Python client the whole time: producer threads sending unique
bodies and one SimpleConsumer receiving and acking, every outcome recorded with its time, both
created once before any fault (they live through it, as applications do). :func:`check` then
reads back what the surviving master holds and reports acked messages lost, redeliveries after an
OK ack and positions (queue, offset) that held two different messages.

(The harness is the part ``plugmq chaos`` provides for the product; these tests keep their own small
one so they stay short and swap in chaos's forwarder and runner once both agree.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.chaos.forwarder import Forwarder
from plugmq.testing import ServeProcess, ZooKeeperServer, wait_for
from plugmq.testing.cluster import CLUSTER_PLUGINS, query_route, status_or_none
from plugmq.testing.failover import read_until_held
from plugmq.testing.zookeeper import free_port

TOPIC = "FaultTopic"
GROUP = "fault-readers"
BROKER = "broker-x"


class Pair:
    """Two failover brokers of ``BROKER`` (see the module doc). Stopped by :meth:`close`."""

    def __init__(self, directory: Path, zookeeper: ZooKeeperServer, *, mode: str, session_timeout_s: float = 2.0,
                 min_in_sync: int = 1, secret: Path | None = None, ha_tls: Mapping[str, str] | None = None,
                 server: str = "") -> None:
        """``server``: more lines of the brokers' [server] tables."""
        assert zookeeper.port is not None
        self.server = server
        self.directory = directory
        self.secret = secret  # the cluster secret file (ha's and cluster_zk's secret_file), if any
        self.ha_tls = dict(ha_tls or {})  # [plugins.ha] tls_* options, if any
        self.session_timeout_s = session_timeout_s
        self.cluster = f"x{uuid.uuid4().hex[:8]}"
        self.zk_links = [Forwarder(f"zk-{i}", ("127.0.0.1", zookeeper.port)) for i in range(2)]
        ha_ports = [free_port() for _ in range(2)]
        self.ha_links = [Forwarder(f"ha-{i}", ("127.0.0.1", port)) for i, port in enumerate(ha_ports)]
        self.configs = [self._config(i, mode, ha_ports[i], min_in_sync) for i in range(2)]
        # Fixed client ports: a restarted broker is back where the clients' routes point.
        self.listen = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        self.processes: list[ServeProcess | None] = [ServeProcess(c, listen=a) for c, a in zip(self.configs, self.listen)]
        self.addresses = [p.await_address() for p in self.processes if p is not None]
        self.frozen: set[int] = set()
        self.elections: list[float] = []  # when a test saw a newer master elected (monotonic)

    def _config(self, i: int, mode: str, ha_port: int, min_in_sync: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"n{i}.toml"
        path.write_text(
            f'[broker]\nname = "{BROKER}"\ndata_dir = "n{i}"\nbroker_id = {i + 1}\nrole = "{mode}"\nfailover = true\n'
            f"plugins = {json.dumps([*CLUSTER_PLUGINS, 'ha'])}\n"
            f'[cluster]\nname = "{self.cluster}"\n'
            f'[plugins.cluster_zk]\nhosts = "{self.zk_links[i].address}"\nsession_timeout_s = {self.session_timeout_s}\n'
            + (f'secret_file = "{self.secret}"\n' if self.secret else "")
            + f'[plugins.ha]\nlisten = "127.0.0.1:{ha_port}"\nadvertise = "{self.ha_links[i].address}"\n'
            "heartbeat_ms = 100\npeer_timeout_ms = 3000\nreconnect_ms = 20\nreconnect_max_ms = 200\n"
            f"sync_timeout_ms = 3000\nin_sync_lag_ms = 600\nmin_in_sync_replicas = {min_in_sync}\n"
            + (f'secret_file = "{self.secret}"\n' if self.secret else "")
            + "".join(f'{key} = "{value}"\n' for key, value in self.ha_tls.items())
            + f"[server]\nlong_polling_s = 1\n{self.server}", encoding="utf-8")
        return path

    # ------------------------------------------------------------------------------ state
    def status(self, i: int) -> dict[str, Any] | None:
        return None if self.processes[i] is None or i in self.frozen else status_or_none(self.addresses[i])

    def master(self, wait_s: float = 30.0) -> int:
        """The index of the broker that is master with its peer in its in-sync set (waits)."""
        found: list[int] = []

        def settled() -> bool:
            for i in range(2):
                status = self.status(i)
                if status and status["role"] != "slave":
                    slaves = status["replication"]["slaves"]
                    if slaves and all(s["in_sync"] for s in slaves):
                        found[:] = [i]
                        return True
            return False

        wait_for(settled, wait_s, "a master with its slave in sync")
        return found[0]

    def endpoints(self) -> str:
        """Both brokers as one access point (the client's name-server list)."""
        return ";".join(self.addresses)

    # ------------------------------------------------------------------------------ faults
    def kill(self, i: int) -> None:
        process = self.processes[i]
        if process is not None:
            process.stop(signal.SIGKILL)
            self.processes[i] = None

    def restart(self, i: int) -> None:
        assert self.processes[i] is None
        process = ServeProcess(self.configs[i], listen=self.listen[i])
        self.processes[i] = process
        self.addresses[i] = process.await_address()

    def freeze(self, i: int) -> None:
        process = self.processes[i]
        assert process is not None
        process.process.send_signal(signal.SIGSTOP)
        self.frozen.add(i)

    def thaw(self, i: int) -> None:
        process = self.processes[i]
        assert process is not None
        process.process.send_signal(signal.SIGCONT)
        self.frozen.discard(i)

    def log_of(self, i: int) -> str:
        return self.configs[i].with_suffix(".log").read_text("utf-8", errors="replace")

    def close(self) -> None:
        for i in list(self.frozen):
            self.thaw(i)
        for process in self.processes:
            if process is not None:
                process.stop(signal.SIGTERM)
        for link in (*self.zk_links, *self.ha_links):
            link.stop()


@contextlib.contextmanager
def running_pair(directory: Path, zookeeper: ZooKeeperServer, *, mode: str, session_timeout_s: float = 2.0,
                 secret: Path | None = None, ha_tls: Mapping[str, str] | None = None, server: str = ""
                 ) -> Iterator[Pair]:
    """A :class:`Pair`, closed when the block ends."""
    pair = Pair(directory, zookeeper, mode=mode, session_timeout_s=session_timeout_s, secret=secret, ha_tls=ha_tls,
                server=server)
    try:
        yield pair
    finally:
        pair.close()


@attrs.define
class Traffic:
    """The official Python client sending and receiving the whole time (see the module doc)."""

    endpoints: str
    producers: int = 4
    acked: list[tuple[float, bytes]] = attrs.field(factory=list)
    send_failures: list[tuple[float, str]] = attrs.field(factory=list)
    deliveries: list[tuple[float, bytes, int, int]] = attrs.field(factory=list)  # time, body, queue, offset
    receives: list[tuple[float, float]] = attrs.field(factory=list)  # started, answered: receives that got messages
    acks: list[tuple[float, bytes, bool]] = attrs.field(factory=list)  # time, body, OK
    receive_failures: list[tuple[float, str]] = attrs.field(factory=list)
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _threads: list[threading.Thread] = attrs.field(factory=list)
    _producer: Any = None
    _consumer: Any = None

    def start(self) -> Traffic:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

        self._producer = Producer(ClientConfiguration(self.endpoints, Credentials(), request_timeout=2), (TOPIC,))
        self._producer.startup()
        self._consumer = SimpleConsumer(ClientConfiguration(self.endpoints, Credentials(), request_timeout=4), GROUP,
                                        {TOPIC: FilterExpression()}, await_duration=1)
        self._consumer.startup()
        self._threads = [threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(self.producers)]
        self._threads.append(threading.Thread(target=self._receive, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def _send(self, index: int) -> None:
        from rocketmq import Message

        sequence = 0
        while not self._stop.is_set():
            message = Message()
            message.topic = TOPIC
            message.body = f"p{index}-{sequence}".encode()
            sequence += 1
            try:
                self._producer.send(message)
            except Exception as exc:  # noqa: BLE001 - a failed send is an outcome
                with self._lock:
                    self.send_failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"[:200]))
                self._stop.wait(0.02)
                continue
            with self._lock:
                self.acked.append((time.monotonic(), bytes(message.body)))

    def _receive(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                batch = self._consumer.receive(16, 15)
            except Exception as exc:  # noqa: BLE001 - a failed receive is an outcome
                with self._lock:
                    self.receive_failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"[:200]))
                self._stop.wait(0.05)
                continue
            if batch:
                with self._lock:
                    self.receives.append((started, time.monotonic()))
            for message in batch:
                queue, offset = _position(message.receipt_handle)
                with self._lock:
                    self.deliveries.append((time.monotonic(), bytes(message.body), queue, offset))
                try:
                    self._consumer.ack(message)
                    ok = True
                except Exception:  # noqa: BLE001 - a failed ack is an outcome
                    ok = False
                with self._lock:
                    self.acks.append((time.monotonic(), bytes(message.body), ok))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        for client in (self._producer, self._consumer):
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001 - shutting down a client whose broker is gone
                pass

    def sent_ok_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first send acked after it (None: none was)."""
        with self._lock:
            times = [t for t, _ in self.acked if t > moment]
        return min(times) - moment if times else None

    def received_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first receive called after it that got messages."""
        with self._lock:
            times = [answered for started, answered in self.receives if started > moment]
        return min(times) - moment if times else None


def _position(receipt_handle: str) -> tuple[int, int]:
    """(queue id, queue offset) a receipt handle names: the pop service's ``queue:offset:seq``, which
    the server seals with a MAC after ``~`` (plugmq.server.receipts)."""
    from plugmq.broker.pop import ReceiptHandle

    handle = ReceiptHandle.parse(receipt_handle.split("~", 1)[0])
    return handle.queue_id, handle.offset


@attrs.frozen
class Verdict:
    """``redelivered_after_ok_ack``: bodies delivered again from a (queue, offset) whose ack the
    client was told succeeded. ``duplicated``: bodies stored at two positions (a send the client
    retried after its first try was stored but not confirmed: at-least-once sending)."""

    acked: int
    lost: frozenset[bytes]
    redelivered_after_ok_ack: frozenset[bytes]
    positions_with_two_messages: dict[tuple[int, int], frozenset[bytes]]
    delivered: int
    duplicated: frozenset[bytes] = frozenset()

    def story(self, traffic: Traffic, bodies: frozenset[bytes], moments: list[float]) -> str:
        """What happened to ``bodies`` (seconds relative to the first fault), for a failure message."""
        zero = moments[0] if moments else 0.0
        lines = [f"faults at {[round(m - zero, 3) for m in moments]}"]
        for body in sorted(bodies)[:5]:
            events = [(t - zero, f"delivered q{q} o{o}") for t, b, q, o in traffic.deliveries if b == body]
            events += [(t - zero, f"ack {'OK' if ok else 'failed'}") for t, b, ok in traffic.acks if b == body]
            events += [(t - zero, "send acked") for t, b in traffic.acked if b == body]
            lines.append(f"{body!r}: " + ", ".join(f"{what} at {at:.3f}" for at, what in sorted(events)))
        return "\n".join(lines)

    def summary(self) -> str:
        return (f"{self.acked} acked, {len(self.lost)} lost, {self.delivered} delivered, "
                f"{len(self.redelivered_after_ok_ack)} redelivered after an OK ack, "
                f"{len(self.positions_with_two_messages)} positions with two messages, "
                f"{len(self.duplicated)} stored twice by a client's retry")


def check(traffic: Traffic, held: set[bytes]) -> Verdict:
    """What the client was told against what the brokers hold (see the module doc)."""
    acked = {body for _, body in traffic.acked}
    # Deliveries and acks pair up in order: the consumer acks each message right after receiving it.
    ok_acked_at: dict[tuple[int, int], float] = {}
    for (_, body, queue, offset), (at, acked_body, ok) in zip(traffic.deliveries, traffic.acks, strict=False):
        assert body == acked_body
        if ok and (queue, offset) not in ok_acked_at:
            ok_acked_at[(queue, offset)] = at
    redelivered = frozenset(body for at, body, queue, offset in traffic.deliveries
                            if (queue, offset) in ok_acked_at and at > ok_acked_at[(queue, offset)])
    positions: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    places: dict[bytes, set[tuple[int, int]]] = defaultdict(set)
    for _, body, queue, offset in traffic.deliveries:
        positions[(queue, offset)].add(body)
        places[body].add((queue, offset))
    doubled = {p: frozenset(bodies) for p, bodies in positions.items() if len(bodies) > 1}
    duplicated = frozenset(body for body, where in places.items() if len(where) > 1)
    return Verdict(len(acked), frozenset(acked - held), redelivered, doubled, len(traffic.deliveries), duplicated)


def declare_topic(pair: Pair) -> None:
    """``TOPIC`` created on the master and routed by both brokers before the clients start: a client
    that finds no route retries it only ~10 s later, which would be idle time before the first fault."""
    query_route(pair.addresses[pair.master()], TOPIC)  # the master creates a topic it is asked to route

    def routed_by_both() -> bool:
        try:
            return all(query_route(address, TOPIC) for address in pair.addresses)
        except RuntimeError:  # the slave has not seen the new topic's declaration yet
            return False

    wait_for(routed_by_both, 30, f"both brokers to route {TOPIC}")


def run_faults(pair: Pair, fault: Callable[[Pair, int], float], rounds: int, *, settle_s: float = 1.0
               ) -> tuple[Verdict, list[float], list[float]]:
    verdict, sends_back, receives_back, _, _ = run_faults_traced(pair, [fault] * rounds, settle_s=settle_s)
    return verdict, sends_back, receives_back


def _one_round(pair: Pair, fault: Callable[[Pair, int], float], traffic: Traffic, settle_s: float) -> float:
    """Traffic under way (sends and receives) before the fault, the fault, then both working again."""
    master = pair.master()
    _served_since(traffic, time.monotonic(), settle_s, "before the fault")
    moment = fault(pair, master)
    wait_for(lambda: traffic.sent_ok_after(moment) is not None, 60, "a send to succeed after the fault")
    wait_for(lambda: traffic.received_after(moment) is not None, 60, "a receive to succeed after the fault")
    return moment


def _served_since(traffic: Traffic, since: float, settle_s: float, when: str) -> None:
    wait_for(lambda: traffic.sent_ok_after(since) is not None, 60, f"sends {when}")
    wait_for(lambda: traffic.received_after(since) is not None, 60, f"receives {when}")
    wait_for(lambda: time.monotonic() - since >= settle_s, 60, f"the traffic to settle {when}")


def run_faults_traced(pair: Pair, plan: Sequence[Callable[[Pair, int], float]], *, settle_s: float = 1.0
                      ) -> tuple[Verdict, list[float], list[float], Traffic, list[float]]:
    """The faults of ``plan`` one after the other, the official client's traffic running all along:
    before each, a master with its slave in sync and ``settle_s`` of traffic; ``fault(pair, master)``
    injects and heals (it returns the moment the master was lost, or the fault began). Then the
    verdict, per fault the seconds until a send and a receive succeeded again, the traffic and the
    fault moments."""
    declare_topic(pair)
    traffic = Traffic(pair.endpoints()).start()
    sends_back: list[float] = []
    receives_back: list[float] = []
    moments: list[float] = []
    try:
        for fault in plan:
            moment = _one_round(pair, fault, traffic, settle_s)
            moments.append(moment)
            sends_back.append(traffic.sent_ok_after(moment) or 0.0)
            receives_back.append(traffic.received_after(moment) or 0.0)
        pair.master()
        _served_since(traffic, time.monotonic(), settle_s, "after the last fault")
    finally:
        traffic.stop()
    master = pair.master()
    # Stops once every acked body was read: no acked message is lost then, and the checker needs no more.
    acked = {body for _, body in traffic.acked}
    held = read_until_held(pair.addresses[master], f"check-{uuid.uuid4().hex[:6]}", acked, TOPIC)
    return check(traffic, held), sends_back, receives_back, traffic, moments
