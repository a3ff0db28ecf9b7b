"""The slave's side: connect to the master, append what it streams, confirm, reconnect forever.

One thread: connect, say HELLO with the store's end offset, then for every DATA frame append the
chunk (whole, or refused whole by the store) and ACK the new end. Any failure — the master gone,
a torn frame, a refused chunk — closes the connection; the thread waits (``reconnect_ms``,
doubling up to ``reconnect_max_ms``) and connects again from the store's end, so nothing is
skipped and nothing applied twice.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable

from plugmq.core import LogChunk, PlugmqError, ReplicableStore, StoreError
from plugmq.core.contracts.replication import ConsumerHandover, Replicated
from plugmq.core.errors import ReplicationError
from plugmq.core.logs import get_logger
from plugmq.plugins.ha import frames
from plugmq.plugins.ha.auth import Authenticator, Session, parse_nonce
from plugmq.plugins.ha.epochs import EpochFile
from plugmq.plugins.ha.frames import FrameType
from plugmq.plugins.ha.options import HaOptions, parse_address
from plugmq.plugins.ha.tls import Stream, TlsChannel, TlsSettings

__all__ = ["SlaveSide"]

log = get_logger(__name__)


class SlaveSide:
    """Follows the master at ``options.master`` for broker ``broker_name`` / ``broker_id``."""

    def __init__(self, store: ReplicableStore, options: HaOptions, *, broker_name: str, broker_id: int,
                 replicated: Replicated | None, epochs: EpochFile, master: str,
                 truncated: Callable[[int], None] | None = None,
                 handover: Callable[[], ConsumerHandover] | None = None,
                 handed_over: Callable[[ConsumerHandover], None] | None = None,
                 authenticator: Authenticator | None = None, tls: TlsSettings | None = None) -> None:
        if not master:
            raise ReplicationError(f"broker {broker_name!r} is a slave but [plugins.ha] names no master; "
                                   'add master = "host:port" (the master\'s [plugins.ha] listen address)')
        self.store = store
        self._auth = authenticator
        self._tls = tls
        self._stream: Stream | None = None  # the socket, or the TLS channel over it
        self._session: Session | None = None
        self.options = options
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.address = master
        self.epochs = epochs
        self._replicated = replicated
        self._truncated = truncated
        self._handover = handover
        self._handed_over = handed_over
        self.in_sync = False  # as last heard from the master: this slave held its commit point
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ha-follow-{broker_name}-{broker_id}")
        self.connected = False
        self.master_end: int | None = None
        self.master_commit = 0  # the last commit point the master sent: this slave's readers see no further
        self.connects = 0
        self.chunks = 0  # chunks appended since start
        self.last_error = ""

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self.options.reconnect_ms / 1000
        while not self._stop.is_set():
            chunks = self.chunks
            try:
                self._follow()
            except (OSError, PlugmqError) as exc:
                reason = str(exc) or type(exc).__name__
                if not self._stop.is_set():
                    if reason != self.last_error or self.chunks > chunks:
                        log.warning("replication from master interrupted; reconnecting", master=self.address,
                                    broker=self.broker_name, end=self._end(), reason=reason)
                    self.last_error = reason
            finally:
                self.connected = False
                self._stream = None
                sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
            if self.chunks > chunks:  # it made progress: the next try starts with a short wait again
                backoff = self.options.reconnect_ms / 1000
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self.options.reconnect_max_ms / 1000)

    def _end(self) -> int | None:
        try:
            return self.store.log_end_offset()
        except PlugmqError:
            return None

    def _send(self, data: bytes) -> None:
        assert self._stream is not None
        session = self._session
        self._stream.sendall(data if session is None else session.seal(data))

    def _tls_handshake(self, tls: TlsSettings, sock: socket.socket) -> TlsChannel:
        """TLS to the master: follow it only if the cluster's CA signed its certificate."""
        channel = TlsChannel(sock, tls.client, server_side=False, server_hostname=tls.server_name)
        try:
            channel.handshake()
        except ssl.SSLCertVerificationError as exc:
            raise ReplicationError(
                f"the master at {self.address} presented a TLS certificate that [plugins.ha] tls_ca does not vouch "
                f"for ({exc.verify_message}); not following it") from exc
        except ssl.SSLError as exc:
            raise ReplicationError(
                f"TLS handshake with the master at {self.address} failed ({exc}): is TLS on there too "
                "([plugins.ha] tls_cert), and does its tls_ca vouch for this slave's certificate?") from exc
        except OSError as exc:  # a reset or a timeout: the network, not the certificates
            raise ReplicationError(f"TLS handshake with the master at {self.address} interrupted "
                                   f"({exc.strerror or exc or type(exc).__name__})") from exc
        return channel

    def _first_read(self, reader: frames.Reader) -> tuple[FrameType, bytes]:
        """The master's first answer; a TLS alert instead (TLS 1.3 refuses a client certificate
        only after the client finished its handshake) says the master refused this slave."""
        try:
            return reader.read()
        except ssl.SSLError as exc:
            raise ReplicationError(f"the master at {self.address} refused this slave's TLS certificate ({exc}); "
                                   "give it one that the master's [plugins.ha] tls_ca signed") from exc

    def _authenticate(self, auth: Authenticator, reader: frames.Reader) -> None:
        """The slave's side of the handshake (plugmq.plugins.ha.auth): prove the cluster secret,
        then follow only a master that proves it back; ReplicationError otherwise."""
        slave_nonce = auth.nonce()
        self._send(frames.json_frame(FrameType.AUTH, {"nonce": slave_nonce.hex()}))
        reader.limit = frames.MAX_HANDSHAKE_FRAME
        kind, payload = self._first_read(reader)
        body = frames.parse_json(payload) if kind in (FrameType.CHALLENGE, FrameType.REFUSE) else {}
        if kind is FrameType.REFUSE:
            raise ReplicationError(f"master {self.address} refused this slave: {body.get('reason')}")
        master_nonce = parse_nonce(body.get("nonce"))
        if master_nonce is None:
            raise ReplicationError(f"the peer at {self.address} answered {kind.name} instead of a challenge: it is "
                                   "no master holding the cluster secret (or it has no [plugins.ha] secret_file); "
                                   "not following it")
        epoch = self.epochs.last_epoch
        self._send(frames.json_frame(FrameType.PROVE, {
            "epoch": epoch, "proof": auth.proof("slave", slave_nonce, master_nonce, epoch).hex()}))
        kind, payload = reader.read()
        body = frames.parse_json(payload) if kind in (FrameType.PROVE, FrameType.REFUSE) else {}
        if kind is FrameType.REFUSE:
            raise ReplicationError(f"master {self.address} refused this slave: {body.get('reason')}")
        if not auth.verify("master", slave_nonce, master_nonce, body.get("epoch"), body.get("proof")):
            raise ReplicationError(f"the peer at {self.address} failed to prove the cluster secret for broker "
                                   f"{self.broker_name!r}: not following it (another secret, another broker name, "
                                   "or not a master of this cluster)")
        reader.limit = frames.MAX_FRAME
        self._session = reader.session = auth.session(slave_nonce, master_nonce, master=False)

    def _follow(self) -> None:
        """One connection's life (it ends with an exception, or when the slave closes)."""
        host, port = parse_address(self.address, what="plugins.ha.master")
        sock = socket.create_connection((host, port), timeout=self.options.connect_timeout_ms / 1000)
        self._sock = sock
        if self._stop.is_set():
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.options.peer_timeout_ms / 1000)
        self._stream = sock if self._tls is None else self._tls_handshake(self._tls, sock)
        reader = frames.Reader(self._stream, self.address)
        self._session = None
        if self._auth is not None:
            self._authenticate(self._auth, reader)
        end = self._join(reader)
        self._stream_log(reader, end)

    def _join(self, reader: frames.Reader) -> int:
        """HELLO, then the master's WELCOME: cut the log back where it says, take its epochs, and
        forget the consumer progress it adopted. Returns this slave's log end to stream from."""
        store = self.store
        end = store.log_end_offset()
        hello = {
            "version": frames.PROTOCOL_VERSION, "broker_name": self.broker_name, "broker_id": self.broker_id,
            "format": store.log_format, "end": end, "min": store.log_min_offset(), "epoch": self.epochs.last_epoch,
            "epochs": [list(e) for e in self.epochs.entries()]}
        # What this slave's own readers acknowledged while no master was up: the master adopts it
        # (an older master ignores the key and delivers those messages again).
        handover = self._handover() if self._handover is not None else ConsumerHandover()
        if handover:
            hello["consumer_progress"] = handover.as_rows()
        self._send(frames.json_frame(FrameType.HELLO, hello))
        kind, payload = reader.read() if self._auth is not None else self._first_read(reader)
        body = frames.parse_json(payload) if kind in (FrameType.WELCOME, FrameType.REFUSE) else {}
        if kind is FrameType.REFUSE:
            raise ReplicationError(f"master {self.address} refused this slave: {body.get('reason')}")
        if kind is not FrameType.WELCOME:
            raise ReplicationError(f"master {self.address} answered {kind.name} to HELLO")
        self.master_end = int(body.get("end", 0))
        cut = body.get("truncate")
        if isinstance(cut, int) and 0 <= cut < end:
            removed = store.truncate_log(cut)
            log.warning("log cut back to where it agrees with the master (records of an older epoch this master "
                        "never had)", master=self.address, broker=self.broker_name, was=end, now=cut, records=removed)
            end = store.log_end_offset()
            if self._truncated is not None:
                self._truncated(end)
        self.epochs.adopt(body.get("epochs") or [], end)
        if handover and body.get("consumer_progress_taken") and self._handed_over is not None:
            self._handed_over(handover)
            log.info("consumer progress of this slave's readers handed over to the master", master=self.address,
                     broker=self.broker_name, lanes=len(handover))
        self.connected = True
        self.connects += 1
        self.last_error = ""
        log.info("replicating from master", master=self.address, broker=self.broker_name, broker_id=self.broker_id,
                 start=body.get("start"), end=end, master_end=self.master_end)
        return end

    def _stream_log(self, reader: frames.Reader, end: int) -> None:
        """Append what the master streams and ACK it (a heartbeat ACKs only when none went lately)."""
        heartbeat = self.options.heartbeat_ms / 1000
        last_ack = 0.0
        while not self._stop.is_set():
            kind, payload = reader.read()
            if kind is not FrameType.DATA:
                raise ReplicationError(f"master {self.address} sent {kind.name} while streaming")
            start, master_end, commit, records, data = frames.parse_data(payload)
            self.master_end = master_end
            self.master_commit = commit
            self.in_sync = start + len(data) >= commit
            if data:
                end = self._append(LogChunk(start, data, records), end)
            elif time.monotonic() - last_ack < heartbeat / 2:
                continue  # a heartbeat soon after an ACK: the master knows where we are
            self._send(frames.ack_frame(end))
            last_ack = time.monotonic()

    def _append(self, chunk: LogChunk, end: int) -> int:
        """Append a streamed chunk at this slave's ``end``; returns the new end."""
        try:
            end = self.store.append_log(chunk)
        except StoreError as exc:
            if chunk.start > end:
                raise ReplicationError(
                    f"the master no longer holds offsets {end}..{chunk.start} that this slave lacks (its retention "
                    f"removed them first); remove this slave's store so it copies the master afresh ({exc})") from exc
            raise
        self.chunks += 1
        if self._replicated is not None:
            self._replicated(end)
        return end
