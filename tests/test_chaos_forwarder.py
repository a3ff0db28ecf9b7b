"""The chaos forwarder on real loopback sockets: it passes, freezes (a partition: silence, no
reset), delays, loses (a held chunk holds what follows), drops and black-holes connections, heals,
keeps its buffers bounded and leaves no thread behind."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from plugmq.chaos.forwarder import Forwarder
from plugmq.testing import WAIT_S, wait_for

DEADLINE_S = 10.0  # keeps a broken build from hanging; never a timed assertion


class EchoServer:
    """Echoes every byte back on every connection (threads, stopped by the fixture)."""

    def __init__(self, *, echo: bool = True) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.echo = echo
        self.connections: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            if self.echo:
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for sock in [self.listener, *self.connections]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on them
            except OSError:
                pass
            sock.close()
        for thread in [self._accepting, *self._threads]:
            thread.join(DEADLINE_S)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def forwarder(echo: EchoServer) -> Iterator[Forwarder]:
    made = Forwarder("test", ("127.0.0.1", echo.port), seed=7)
    yield made
    made.stop()


def connect(forwarder: Forwarder) -> socket.socket:
    return socket.create_connection(("127.0.0.1", forwarder.port), timeout=DEADLINE_S)


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def nothing_arrives(sock: socket.socket, within_s: float = 0.3) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b"never"  # any byte (or an end) is an arrival
    except TimeoutError:
        return True
    finally:
        sock.settimeout(DEADLINE_S)


def died(sock: socket.socket) -> bool:
    """The connection ends (a reset or an end of stream) before any byte arrives."""
    sock.settimeout(DEADLINE_S)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ConnectionAbortedError):
        return True


def refused(forwarder: Forwarder) -> bool:
    """A connection to ``forwarder`` is refused or reset, at once or before any byte arrives."""
    try:
        sock = connect(forwarder)
    except (ConnectionResetError, ConnectionRefusedError):
        return True
    with sock:
        return died(sock)


def test_passes_bytes_both_ways(forwarder: Forwarder) -> None:
    with connect(forwarder) as sock:
        payload = bytes(range(256)) * 4096  # 1 MiB: more than one chunk
        assert roundtrip(sock, payload) == payload
    assert forwarder.accepted == 1
    # The relay thread counts a chunk after passing it on: the echo may arrive before the count.
    wait_for(lambda: forwarder.bytes_relayed >= 2 * len(payload), WAIT_S, "the relayed bytes to be counted")


def test_freeze_is_silence_then_heal_delivers_what_was_held(forwarder: Forwarder) -> None:
    with connect(forwarder) as sock:
        assert roundtrip(sock, b"before") == b"before"
        forwarder.freeze()
        sock.sendall(b"held")
        assert nothing_arrives(sock), "a frozen link passed bytes"
        late = connect(forwarder)  # the kernel's backlog takes it; the forwarder accepts nothing
        late.sendall(b"late")
        assert nothing_arrives(late)
        assert forwarder.accepted == 1
        forwarder.heal()
        assert sock.recv(4) == b"held", "the held bytes are delivered once healed, not lost"
        assert late.recv(4) == b"late"
        late.close()


def test_delay_holds_each_chunk_that_long(forwarder: Forwarder) -> None:
    with connect(forwarder) as sock:
        forwarder.delay(0.25)
        started = time.monotonic()
        assert roundtrip(sock, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.5, "0.25 s each way"
        forwarder.heal()
        assert roundtrip(sock, b"fast") == b"fast"


def test_loss_holds_a_chunk_for_a_retransmission_and_what_follows_waits(forwarder: Forwarder) -> None:
    with connect(forwarder) as sock:
        forwarder.lose(1.0, retransmit_s=0.2)
        started = time.monotonic()
        sock.sendall(b"a")
        sock.sendall(b"b")
        got = b""
        while len(got) < 2:
            got += sock.recv(2)
        assert got == b"ab", "order is kept"
        assert time.monotonic() - started >= 0.4, "each chunk lost once each way"


def test_drop_resets_open_connections_and_new_ones_pass(forwarder: Forwarder) -> None:
    sock = connect(forwarder)
    assert roundtrip(sock, b"x") == b"x"
    forwarder.drop()
    assert died(sock)
    sock.close()
    with connect(forwarder) as again:
        assert roundtrip(again, b"y") == b"y"


def test_blackholed_connections_are_accepted_and_never_relayed(forwarder: Forwarder) -> None:
    forwarder.blackhole(1.0)
    dark = connect(forwarder)
    dark.sendall(b"anyone?")
    assert nothing_arrives(dark)
    forwarder.heal()
    assert died(dark), "healing closes a black-holed connection: its peer reconnects"
    dark.close()
    with connect(forwarder) as sock:
        assert roundtrip(sock, b"ok") == b"ok"


def test_no_target_refuses_and_retarget_serves(echo: EchoServer) -> None:
    with Forwarder("later") as forwarder:
        assert refused(forwarder)
        forwarder.retarget(("127.0.0.1", echo.port))
        with connect(forwarder) as sock:
            assert roundtrip(sock, b"here") == b"here"


def test_a_dead_target_closes_the_peer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]  # closed below: nothing listens there any more
    with Forwarder("dead", ("127.0.0.1", port)) as forwarder:
        assert refused(forwarder)


def test_buffers_stay_bounded_when_the_target_stops_reading() -> None:
    sink = EchoServer(echo=False)  # accepts, never reads
    try:
        with Forwarder("bounded", ("127.0.0.1", sink.port), buffer_bytes=1 << 20) as forwarder, \
                connect(forwarder) as sock:
            sock.setblocking(False)
            sent = 0
            deadline = time.monotonic() + DEADLINE_S
            # Writable again within 0.5 s while the forwarder keeps reading; then every buffer is full.
            while time.monotonic() < deadline and select.select([], [sock], [], 0.5)[1]:
                try:
                    sent += sock.send(b"z" * 65536)
                except BlockingIOError:
                    pass
            assert sent > 2 << 20, "kernel buffers and the forwarder's took more than 2 MiB"
            assert forwarder.buffered_bytes() <= (1 << 20) + 65536
    finally:
        sink.close()


def test_stop_closes_connections_and_joins_its_thread(echo: EchoServer) -> None:
    before = set(threading.enumerate())
    forwarder = Forwarder("stopped", ("127.0.0.1", echo.port))
    sock = connect(forwarder)
    assert roundtrip(sock, b"1") == b"1"
    forwarder.stop()
    assert died(sock)
    sock.close()
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("chaos-forwarder")]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", forwarder.port), timeout=1).close()

