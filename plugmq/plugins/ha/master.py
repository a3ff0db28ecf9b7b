"""The master's side: accept slaves, stream each its missing log, collect what they confirm.

Per slave two threads, as RocketMQ's HAConnection has: the writer streams chunks from the
slave's offset on, woken by the store's log listener the moment records are readable (before a
sync-flush append waits for its flush, so shipping overlaps the flush); the reader takes the
slave's ACKs. A slow slave fills its own socket buffer and blocks only its own writer; a dead
one is dropped after ``peer_timeout_ms`` of silence. What each slave confirms feeds the in-sync
set and the commit point (:mod:`plugmq.plugins.ha.insync`): a sync send is acked once every
in-sync slave holds it, like RocketMQ's GroupTransferService one ACK releases every send it
covers, so concurrent sends share one round trip; consumers read below the commit point only.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugmq.core import PlugmqError, ReplicableStore, SendStatus, StoreError, ValidationError
from plugmq.core.contracts.leadership import Leadership, LocalLeadership
from plugmq.core.contracts.replication import ConsumerHandover, ReplicaStatus
from plugmq.core.errors import ReplicationError
from plugmq.core.logs import get_logger
from plugmq.kit.addresses import exposed_warning
from plugmq.plugins.ha import frames
from plugmq.plugins.ha.auth import Authenticator, Session, parse_nonce
from plugmq.plugins.ha.epochs import EpochFile, consistent_point
from plugmq.plugins.ha.frames import FrameType
from plugmq.plugins.ha.insync import InSync
from plugmq.plugins.ha.options import HaOptions, parse_address
from plugmq.plugins.ha.tls import HandshakeRefusals, Stream, TlsChannel, TlsSettings

__all__ = ["MasterSide"]

log = get_logger(__name__)

_LAG_COUNT_BUDGET = 16 * 1024 * 1024  # bytes of log scanned to count lagging messages


class _Slave:
    """One connected slave: its socket, its threads and what it confirmed."""

    def __init__(self, master: MasterSide, sock: socket.socket, address: str) -> None:
        self.master = master
        self._tcp = sock
        self.sock: Stream = sock  # the TLS channel over it once the handshake is done
        self.address = address
        self.broker_id = -1
        self.confirmed = 0
        self.sent = 0
        self.alive = True
        self.ready = False  # handshake done: counts for sync double-write
        self.session: Session | None = None  # set once the slave proved the cluster secret

    def send(self, data: bytes) -> None:
        """One frame to the slave (tagged on an authenticated connection)."""
        self.sock.sendall(data if self.session is None else self.session.seal(data))

    def refuse(self, reason: str) -> None:
        """REFUSE and log why. Where the master has a cluster secret, a peer that did not prove it
        learns nothing from the answer; without one the channel is open anyway, and the slave's
        operator is told why."""
        log.error("replication slave refused", slave=self.address, reason=reason)
        secret_kept = self.master.authenticator is not None and self.session is None
        told = "refused; the master's log says why" if secret_kept else reason
        self.send(frames.json_frame(FrameType.REFUSE, {"reason": told}))

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.master.forget(self)

    # -- reader thread: handshake, then ACKs ------------------------------------------------

    def run_reader(self) -> None:
        master = self.master
        auth = master.authenticator
        reader = frames.Reader(self.sock, self.address,
                               limit=frames.MAX_FRAME if auth is None else frames.MAX_HANDSHAKE_FRAME)
        try:
            self.sock.settimeout(master.options.peer_timeout_ms / 1000)
            if master.tls is not None and not self._tls_handshake(master.tls, reader):
                return
            kind, payload = reader.read()
            if auth is not None:
                if not self._authenticate(auth, reader, kind, payload):
                    return
                reader.limit = frames.MAX_FRAME
                kind, payload = reader.read()
            elif kind is FrameType.AUTH:
                self.refuse("the slave authenticates with a cluster secret but this master has none; give both "
                            "the same [plugins.ha] secret_file")
                return
            if kind is not FrameType.HELLO:
                raise ConnectionError(f"expected HELLO, got {kind.name}")
            start = master.admit(self, frames.parse_json(payload))
            if start is None:
                return
            writer = threading.Thread(target=self.run_writer, args=(start,), daemon=True,
                                      name=f"ha-ship-{master.broker_name}-{self.broker_id}")
            writer.start()
            while self.alive:
                kind, payload = reader.read()
                if kind is not FrameType.ACK:
                    raise ConnectionError(f"expected ACK, got {kind.name}")
                master.confirm(self, frames.parse_ack(payload))
        except (OSError, ReplicationError, ValueError) as exc:
            if self.alive and not master.closed:
                log.info("replication slave disconnected", slave=self.address, broker_id=self.broker_id,
                         confirmed=self.confirmed, reason=str(exc) or type(exc).__name__)
        finally:
            self.close()

    def _tls_handshake(self, tls: TlsSettings, reader: frames.Reader) -> bool:
        """TLS before anything else; False (logged, rate-limited) when the peer fails it."""
        channel = TlsChannel(self._tcp, tls.server, server_side=True)
        try:
            channel.handshake()
        except ssl.SSLError as exc:  # a reset or a silent peer is logged as any other disconnect
            self.master.refusals.refused(self.address, getattr(exc, "reason", None) or str(exc),
                                         broker=self.master.broker_name)
            return False
        self.sock = reader.stream = channel
        return True

    def _authenticate(self, auth: Authenticator, reader: frames.Reader, kind: FrameType, payload: bytes) -> bool:
        """The master's side of the handshake (plugmq.plugins.ha.auth); False once refused."""
        slave_nonce = parse_nonce(frames.parse_json(payload).get("nonce")) if kind is FrameType.AUTH else None
        if slave_nonce is None:
            self.refuse(f"it sent {kind.name} without authenticating first (is its [plugins.ha] secret_file set?)")
            return False
        master_nonce = auth.nonce()
        self.send(frames.json_frame(FrameType.CHALLENGE, {"nonce": master_nonce.hex()}))
        kind, payload = reader.read()
        proof = frames.parse_json(payload) if kind is FrameType.PROVE else {}
        if not auth.verify("slave", slave_nonce, master_nonce, proof.get("epoch"), proof.get("proof")):
            self.refuse("its proof of the cluster secret is wrong: another secret, or a broker of another name")
            return False
        epoch = self.master.epochs.last_epoch
        self.send(frames.json_frame(FrameType.PROVE, {
            "epoch": epoch, "proof": auth.proof("master", slave_nonce, master_nonce, epoch).hex()}))
        self.session = reader.session = auth.session(slave_nonce, master_nonce, master=True)
        return True

    # -- writer thread: the log from the slave's offset on -----------------------------------

    def run_writer(self, position: int) -> None:
        master = self.master
        store = master.store
        batch = master.options.transfer_batch_bytes
        heartbeat = master.options.heartbeat_ms / 1000
        try:
            last_sent = time.monotonic()
            while self.alive:
                end = store.log_end_offset()
                if position < end:
                    chunk = store.read_log(position, batch)
                    if chunk.data:
                        master.in_sync.sent(self.broker_id, end)
                        self.send(frames.data_frame(chunk.start, end, master.commit_point(), chunk.records,
                                                    chunk.data))
                        position = self.sent = chunk.end
                        last_sent = time.monotonic()
                        continue
                # Idle: a heartbeat when due; it carries the commit point too.
                if not master.wait_for_append(position, last_sent + heartbeat):
                    end = store.log_end_offset()
                    master.in_sync.sent(self.broker_id, end)
                    self.send(frames.data_frame(position, end, master.commit_point(), 0, b""))
                    last_sent = time.monotonic()
        except (OSError, StoreError) as exc:
            if self.alive and not master.closed:
                log.warning("replication stream to slave stopped", slave=self.address, broker_id=self.broker_id,
                            position=position, reason=str(exc) or type(exc).__name__)
        finally:
            self.close()


class MasterSide:
    """Listens for slaves of this broker name and streams them the commit log."""

    def __init__(self, store: ReplicableStore, options: HaOptions, *, broker_name: str, broker_id: int,
                 plugin_dir: Path, sync: bool, epochs: EpochFile,
                 adopt: Callable[[ConsumerHandover, int], int] | None = None,
                 leadership: Leadership | None = None, authenticator: Authenticator | None = None,
                 tls: TlsSettings | None = None) -> None:
        self.store = store
        self.authenticator = authenticator
        self.tls = tls
        self.refusals = HandshakeRefusals()
        self.broker_id = broker_id
        self._adopt = adopt
        self.epochs = epochs
        self.options = options
        self.broker_name = broker_name
        self.sync = sync
        self._plugin_dir = plugin_dir
        self.closed = False
        self.address = ""
        self._slaves: list[_Slave] = []
        self._lock = threading.Lock()
        # Writers wait here for records; the store's listener wakes them.
        self._appended = threading.Condition()
        self._idle_writers = 0
        self._current: dict[int, _Slave] = {}  # broker id -> its live connection
        self.in_sync = self._in_sync_of(leadership or LocalLeadership(broker_id))
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        host, port = parse_address(self.options.listen, what="plugins.ha.listen", port_zero_ok=True)
        sock = socket.create_server((host, port), reuse_port=False)
        bound_host, bound_port = sock.getsockname()[:2]
        self.address = self.options.advertise or f"{bound_host}:{bound_port}"
        self._listener = sock
        (self._plugin_dir / "listen.addr").write_text(self.address + "\n", encoding="utf-8")
        exposed_warning("ha replication port", f"{bound_host}:{bound_port}", tls=self.tls is not None,
                        authenticated=self.authenticator is not None,
                        fix="set [plugins.ha] secret_file, tls_cert, tls_key and tls_ca on master and slaves, or "
                            "listen on 127.0.0.1")
        self.store.set_log_listener(self._on_append)
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True, name=f"ha-accept-{self.broker_name}")
        self._accepting.start()
        log.info("replication master listening", broker=self.broker_name, address=self.address,
                 mode="sync_master" if self.sync else "async_master", end=self.store.log_end_offset())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.store.set_log_listener(None)
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            slaves = list(self._slaves)
        for slave in slaves:
            slave.close()
        with self._appended:
            self._appended.notify_all()
        self.in_sync.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self.closed:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if not self.closed:
                    log.exception("replication listener failed; slaves cannot connect", address=self.address)
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            slave = _Slave(self, sock, f"{peer[0]}:{peer[1]}")
            with self._lock:
                self._slaves.append(slave)
            threading.Thread(target=slave.run_reader, daemon=True, name=f"ha-slave-{peer[1]}").start()

    # -- slaves -------------------------------------------------------------------------------

    def _identity_refusal(self, hello: dict[str, Any]) -> str | None:
        """Why a HELLO is not from a slave this master can serve (protocol, name, id, log format,
        end offset); None when it is."""
        slave_end = hello.get("end")
        if hello.get("version") != frames.PROTOCOL_VERSION:
            return f"protocol version {hello.get('version')!r}; this master speaks {frames.PROTOCOL_VERSION}"
        if hello.get("broker_name") != self.broker_name:
            return (f"it is a slave of broker {hello.get('broker_name')!r} but this master is {self.broker_name!r}; "
                    "give master and slave the same [broker] name")
        if not isinstance(hello.get("broker_id"), int) or hello["broker_id"] < 1:
            return f"broker id {hello.get('broker_id')!r}; a slave has [broker] broker_id >= 1"
        if hello.get("format") != self.store.log_format:
            return (f"its store keeps the log as {hello.get('format')!r}, this master as {self.store.log_format!r}; "
                    "use the same storage plugin (and segment size) on both")
        if not isinstance(slave_end, int) or slave_end < 0:
            return f"bad end offset {slave_end!r}"
        return None

    @staticmethod
    def _log_match(mine: list[tuple[int, int]], end: int, theirs: list[tuple[int, int]],
                   slave_end: int) -> tuple[int | None, str | None]:
        """Where the slave's log meets this master's (the offset it must cut back to, None: no cut)
        or why it cannot follow (a newer epoch fences this master; no shared epoch; a longer log)."""
        my_epoch = mine[-1][0] if mine else 0
        their_epoch = theirs[-1][0] if theirs else 0
        if their_epoch > my_epoch:
            log.error("replication master fenced: a slave knows a newer epoch", epoch=my_epoch, newer=their_epoch)
            return None, (f"it knows master epoch {their_epoch}, newer than this master's {my_epoch}: this broker is "
                          "no longer the master of its name (fenced); it must follow the newer master")
        if theirs and mine:
            cut = consistent_point(mine, end, theirs, slave_end)
            if cut is None:
                return None, (f"its log (epochs {theirs}) shares no epoch with this master's ({mine}); remove the "
                              "slave's store so it copies the master afresh")
            return cut, None
        if slave_end > end:
            return None, (f"it holds log up to {slave_end}, past this master's end {end}: it was a master itself or "
                          "followed another one; cut it back or remove its data before it rejoins")
        return None, None

    def admit(self, slave: _Slave, hello: dict[str, Any]) -> int | None:
        """Check a HELLO; answer WELCOME with the stream's start (or REFUSE and return None)."""
        store = self.store
        end, low = store.log_end_offset(), store.log_min_offset()
        slave_end = hello.get("end")
        mine = self.epochs.entries()
        my_epoch = mine[-1][0] if mine else 0
        cut: int | None = None
        try:
            theirs = [(int(e), int(s)) for e, s in hello.get("epochs") or []]
        except (TypeError, ValueError):
            theirs = []
            reason: str | None = f"bad epoch entries {hello.get('epochs')!r}"
        else:
            reason = None
        reason = self._identity_refusal(hello) or reason
        if reason is None:
            assert isinstance(slave_end, int)
            cut, reason = self._log_match(mine, end, theirs, slave_end)
        if reason is None and cut is not None and isinstance(slave_end, int) and cut < slave_end:
            log.warning("replication slave diverged from this master: it cuts its log back", slave=slave.address,
                        broker_id=hello.get("broker_id"), slave_end=slave_end, cut_to=cut,
                        dropped_bytes=slave_end - cut, slave_epochs=theirs, master_epochs=mine)
            slave_end = cut
        if reason is not None:
            slave.refuse(reason)
            return None
        assert isinstance(slave_end, int)
        start = max(slave_end, low)
        self._take_place(slave, hello["broker_id"], slave_end)
        taken = self._adopt_progress(slave, hello.get("consumer_progress"), slave_end)
        welcome: dict[str, Any] = {"start": start, "end": end, "min": low, "format": store.log_format,
                                   "epoch": my_epoch, "epochs": [list(e) for e in mine]}
        if taken:
            welcome["consumer_progress_taken"] = True
        if cut is not None and cut < int(hello["end"]):
            welcome["truncate"] = cut
        slave.send(frames.json_frame(FrameType.WELCOME, welcome))
        self.in_sync.connected(slave.broker_id, slave_end)
        slave.ready = True
        log.info("replication slave connected", slave=slave.address, broker_id=slave.broker_id, start=start,
                 master_end=end, lag_bytes=end - slave_end)
        return start

    def _take_place(self, slave: _Slave, broker_id: int, slave_end: int) -> None:
        """``slave`` is broker ``broker_id``'s connection now; an older one of the same slave goes."""
        slave.broker_id = broker_id
        slave.confirmed = slave.sent = slave_end
        with self._lock:
            self._current[broker_id] = slave
            for old in [s for s in self._slaves if s is not slave and s.broker_id == broker_id]:
                old.alive = False  # a reconnect replaces a half-open connection of the same slave
                threading.Thread(target=old.close, daemon=True).start()

    def _adopt_progress(self, slave: _Slave, rows: Any, shared_end: int) -> bool:
        """The consumer progress a slave's readers made while no master was up (its HELLO's
        ``consumer_progress``), handed to the broker with where both logs agree (``shared_end``:
        the slave's end, or where it is cut back to) before WELCOME; True when it was taken (the
        WELCOME says so, and only then the slave forgets it: else it offers it again at its next
        connect). A bad or failed hand-over is logged; it costs repeated deliveries only."""
        if not rows or self._adopt is None:
            return False
        try:
            lanes = ConsumerHandover.from_rows(rows)
        except (ValidationError, TypeError) as exc:
            log.warning("replication slave handed over unreadable consumer progress; ignored", slave=slave.address,
                        reason=str(exc))
            return True  # offering it again would not make it readable
        try:
            moved = self._adopt(lanes, shared_end)
        except PlugmqError as exc:
            log.warning("consumer progress handed over by a slave not taken yet", slave=slave.address, reason=str(exc))
            return False
        except Exception:  # the stream matters more; the messages are delivered again instead
            log.exception("consumer progress handed over by a slave not taken", slave=slave.address)
            return False
        log.info("consumer progress handed over by a slave", slave=slave.address, broker_id=slave.broker_id,
                 lanes=len(lanes), moved=moved)
        return True

    def forget(self, slave: _Slave) -> None:
        with self._lock:
            if slave in self._slaves:
                self._slaves.remove(slave)
            current = self._current.get(slave.broker_id) is slave
            if current:
                del self._current[slave.broker_id]
        if current and slave.ready:
            self.in_sync.disconnected(slave.broker_id)

    def _ready_slaves(self) -> list[_Slave]:
        with self._lock:
            return [s for s in self._slaves if s.ready and s.alive]

    def confirm(self, slave: _Slave, offset: int) -> None:
        slave.confirmed = max(slave.confirmed, offset)
        self.in_sync.confirmed(slave.broker_id, offset)

    # -- the in-sync set and the commit point -------------------------------------------------

    def _in_sync_of(self, leadership: Leadership) -> InSync:
        options = self.options
        return InSync(leadership, me=self.broker_id, log_end=self.store.log_end_offset,
                      min_in_sync=options.min_in_sync_replicas, max_lag_s=options.lag_limit_ms / 1000,
                      join_gap_bytes=options.join_gap_bytes, broker_name=self.broker_name)

    def lead(self, leadership: Leadership) -> None:
        """A new election won: its set starts over (the slaves connected join it again)."""
        old, self.in_sync = self.in_sync, self._in_sync_of(leadership)
        old.close()
        for slave in self._ready_slaves():
            self.in_sync.connected(slave.broker_id, slave.confirmed)

    def commit_point(self) -> int:
        return self.in_sync.commit_point()

    def committed_offset(self) -> int | None:
        """The commit point while the leadership holds; None when this master may not serve."""
        in_sync = self.in_sync
        return in_sync.commit_point() if in_sync.leadership.holds() else None

    def admit_write(self) -> SendStatus:
        return self.in_sync.admit(self.sync)

    # -- writers wait for records -------------------------------------------------------------

    def _on_append(self, _end: int) -> None:
        if self._idle_writers:
            with self._appended:
                self._appended.notify_all()

    def wait_for_append(self, position: int, deadline: float) -> bool:
        """Block until the log grows past ``position``; False at ``deadline`` (time for a heartbeat)."""
        with self._appended:
            self._idle_writers += 1
            try:
                while not self.closed and self.store.log_end_offset() <= position:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._appended.wait(remaining)
            finally:
                self._idle_writers -= 1
        return True

    # -- sync double-write --------------------------------------------------------------------

    def await_replicated(self, end_offset: int) -> SendStatus:
        return self.in_sync.await_commit(end_offset, self.options.sync_timeout_ms / 1000, sync=self.sync)

    def await_committed(self, end_offset: int) -> bool:
        return self.in_sync.await_committed(end_offset, self.options.sync_timeout_ms / 1000)

    # -- status -------------------------------------------------------------------------------

    @property
    def confirmed_offset(self) -> int:
        return self.in_sync.commit_point()

    def slave_statuses(self, count: Callable[[int, int], int | None]) -> tuple[ReplicaStatus, ...]:
        end = self.store.log_end_offset()
        members = self.in_sync.members
        return tuple(
            ReplicaStatus(broker_id=s.broker_id, address=s.address, confirmed_offset=s.confirmed,
                          lag_bytes=max(0, end - s.confirmed), lag_messages=count(s.confirmed, end),
                          in_sync=s.broker_id in members)
            for s in sorted(self._ready_slaves(), key=lambda s: s.broker_id))

    def count_records(self, start: int, end: int) -> int | None:
        """How many records lie in [start, end); None when that is more log than the budget."""
        if end - start > _LAG_COUNT_BUDGET:
            return None
        position, records = start, 0
        try:
            while position < end:
                chunk = self.store.read_log(position, min(end - position, 4 * 1024 * 1024))
                if not chunk.data:
                    break
                records += chunk.records
                position = chunk.end
        except StoreError:
            return None
        return records
