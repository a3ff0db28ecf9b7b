"""TLS on the ha channel: the contexts from ``[plugins.ha] tls_*``, and a connection that one
reader thread and one writer thread may use at once.

Why not ``ssl.SSLSocket``: the master reads a slave's ACKs in one thread while another streams
the log to it, and OpenSSL forbids ``SSL_read`` and ``SSL_write`` on one ``SSL`` object from two
threads at once (OpenSSL's maintainers say so in openssl/openssl#20446; CPython's ``SSLSocket``
adds no lock of its own, and the race crashes it: python/cpython#151508, #143756). So the TLS
state is an ``ssl.SSLObject`` over two ``MemoryBIO`` s behind one lock that is held only while
OpenSSL encrypts or decrypts in memory - never across a blocking ``send`` or ``recv`` of the
TCP socket, so a reader blocked waiting for bytes never holds up the writer. A second lock keeps
the encrypted records of concurrent senders in order on the wire. ``shutdown`` and ``close`` act
on the TCP socket, so they unblock both threads as before.

Hostname check: a master's replication address is often an IP, and every certificate the
cluster's CA signs is a broker of the cluster already. So the slave checks the master's chain
against ``tls_ca`` only; with ``tls_server_name`` it also checks that name (a DNS or IP SAN) in
the master's certificate. The cluster secret, when set, still proves the broker name on top.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Protocol, cast

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.kit.pemfiles import check_cert_and_key

__all__ = ["HandshakeRefusals", "Stream", "TlsChannel", "TlsSettings", "check_tls_files"]

log = get_logger(__name__)

_RECV_BYTES = 256 * 1024
_WHERE = "plugins.ha"


class Stream(Protocol):
    """What the ha channel does with a connection: a plain socket or a :class:`TlsChannel`."""

    def sendall(self, data: bytes, /) -> None: ...

    def recv_into(self, buffer: memoryview, /) -> int: ...

    def settimeout(self, value: float | None, /) -> None: ...

    def shutdown(self, how: int, /) -> None: ...

    def close(self) -> None: ...


def check_tls_files(cert: str, key: str, ca: str) -> None:
    """ConfigError naming the ``[plugins.ha]`` option whose file is missing, unreadable, not PEM,
    expired or not the key of the certificate."""
    if ca and not cert:
        raise ConfigError(f"{_WHERE}.tls_ca is set without tls_cert and tls_key: every broker of a TLS cluster "
                          "may become master (failover), so each needs its own certificate and key too")
    check_cert_and_key(_WHERE, cert, key)


class TlsSettings:
    """The two contexts of one broker: the master's (serves, with a CA requires slave
    certificates) and the slave's (presents its certificate, verifies the master's)."""

    def __init__(self, cert: str, key: str, ca: str, server_name: str = "") -> None:
        cert_path, key_path = str(Path(cert).expanduser()), str(Path(key).expanduser())
        ca_path = str(Path(ca).expanduser()) if ca else None
        self.server_name = server_name or None
        self.mutual = ca_path is not None
        try:
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.minimum_version = ssl.TLSVersion.TLSv1_2
            server.load_cert_chain(cert_path, key_path)
            if ca_path is not None:
                server.load_verify_locations(cafile=ca_path)
                server.verify_mode = ssl.CERT_REQUIRED
            client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            client.minimum_version = ssl.TLSVersion.TLSv1_2
            client.load_cert_chain(cert_path, key_path)
            if ca_path is not None:
                client.load_verify_locations(cafile=ca_path)
            else:
                client.load_default_certs()
            client.check_hostname = self.server_name is not None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{_WHERE}: the TLS files (tls_cert {cert}, tls_key {key}, tls_ca {ca or '-'}) cannot "
                              f"be loaded: {exc}") from exc
        self.server = server
        self.client = client


class TlsChannel:
    """A TLS connection over a blocking TCP socket, safe for one reader and one writer thread at
    once (see the module doc). ``handshake()`` first, from one thread."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._state = threading.Lock()  # the SSLObject and its BIOs: held only in memory work
        self._sending = threading.Lock()  # encrypted records reach the socket in the order made

    def handshake(self) -> None:
        """Complete the TLS handshake (ssl.SSLError when the peer's certificate or protocol fails).

        On failure nothing more is sent: a peer that is no TLS client gets no answer at all."""
        while True:
            with self._state:
                try:
                    self._tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                except ssl.SSLCertVerificationError:
                    self._tell_peer()  # a TLS peer with a certificate we refuse: tell it why
                    raise
            self._flush()
            if done:
                return
            self._receive()

    def _tell_peer(self) -> None:
        """Send the alert OpenSSL made (best effort; called with ``_state`` held)."""
        try:
            self._sock.sendall(self._outgoing.read())
        except OSError:
            pass

    def _flush(self) -> None:
        with self._sending:
            with self._state:
                data = self._outgoing.read()
            if data:
                self._sock.sendall(data)

    def _receive(self) -> None:
        data = self._sock.recv(_RECV_BYTES)  # outside both locks: the writer goes on meanwhile
        with self._state:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()

    def sendall(self, data: bytes) -> None:
        with self._sending:
            with self._state:
                self._tls.write(data)  # into a memory BIO: never blocks, takes it all
                encrypted = self._outgoing.read()
            self._sock.sendall(encrypted)

    def recv_into(self, buffer: memoryview) -> int:
        """Decrypted bytes into ``buffer``; 0 once the peer closed the connection."""
        while True:
            with self._state:
                try:
                    got: int | None = cast(int, self._tls.read(len(buffer), buffer))  # with a buffer: a count
                except ssl.SSLWantReadError:
                    got = None
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0
                reply = self._outgoing.pending  # e.g. a TLS 1.3 key update answered while reading
            if reply:
                self._flush()
            if got is not None:
                return got
            self._receive()

    def settimeout(self, value: float | None) -> None:
        self._sock.settimeout(value)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()


class HandshakeRefusals:
    """Logs refused TLS handshakes at most once per ``interval_s`` (with how many were dropped in
    between), so a scanner or a plain-TCP peer retrying in a loop cannot flood the log."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self._interval = interval_s
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._suppressed = 0

    def refused(self, peer: str, reason: str, *, broker: str) -> bool:
        """Count one refusal; log it when due. True when it was logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                self._suppressed += 1
                return False
            self._last, suppressed, self._suppressed = now, self._suppressed, 0
        log.warning("replication peer refused: TLS handshake failed (a peer without TLS, or whose certificate "
                    "the cluster's CA did not sign)", broker=broker, peer=peer, reason=reason,
                    refused_since_last_log=suppressed)
        return True
