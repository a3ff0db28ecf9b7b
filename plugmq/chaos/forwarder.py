"""A loopback TCP forwarder that can cut, slow down or lose one link (no netem needed).

One :class:`Forwarder` stands between one kind of peer and one target (clients and a broker's
gRPC port, a broker and ZooKeeper, a slave and its master's ha port): the peer connects to the
forwarder, which connects to the target and relays bytes both ways on one thread of its own.
What it does to the traffic is its :class:`LinkState`, changed at any time:

* ``frozen``: a partition. Nothing is accepted (new connections wait in the listen backlog, as
  SYNs to an unreachable host do) and nothing moves on open connections: bytes stay in kernel
  buffers and in the forwarder's, connections stay open, peers see silence, not a reset;
* ``delay_s``: every chunk is released that long after it arrived (order kept);
* ``loss``: each chunk is held back one ``retransmit_s`` with this probability, and what follows
  it waits behind it (what a lost segment costs a TCP stream: a retransmission timeout);
* ``blackhole``: this fraction of new connections is accepted and then never relayed.

:meth:`Forwarder.drop` closes open connections (with a reset); :meth:`Forwarder.heal` returns
to passing. Buffers are bounded (``buffer_bytes`` a direction: the forwarder stops reading a side
whose bytes it cannot pass on yet). :meth:`Forwarder.stop` joins the thread and closes every
socket.
"""

from __future__ import annotations

import collections
import errno
import random
import selectors
import socket
import struct
import threading
from typing import Self

import attrs

from plugmq.core.clock import Clock, SystemClock
from plugmq.core.logs import get_logger

__all__ = ["Forwarder", "LinkState"]

log = get_logger(__name__)

_CHUNK = 64 * 1024


@attrs.frozen
class LinkState:
    """What a forwarder does to its link; the default passes everything at once."""

    frozen: bool = False
    delay_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    loss: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    retransmit_s: float = attrs.field(default=0.2, validator=attrs.validators.ge(0.0))
    blackhole: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])


class _Direction:
    """Bytes read from ``source`` waiting to be written to ``sink``: (release time, chunk);
    an empty chunk is the source's end of stream."""

    def __init__(self, source: socket.socket, sink: socket.socket) -> None:
        self.source = source
        self.sink = sink
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.last_release = 0.0
        self.ended = False

    def push(self, release: float, chunk: bytes) -> None:
        release = max(release, self.last_release)  # a stream keeps its order
        self.last_release = release
        self.queue.append((release, chunk))
        self.queued += len(chunk)

    def due(self, now: float) -> bool:
        return bool(self.queue) and self.queue[0][0] <= now


class _Pipe:
    """One relayed connection: the accepted peer and the connection to the target."""

    def __init__(self, peer: socket.socket, upstream: socket.socket, *, blackholed: bool) -> None:
        self.peer = peer
        self.upstream = upstream
        self.connected = False
        self.blackholed = blackholed
        self.directions = (_Direction(peer, upstream), _Direction(upstream, peer))
        self.closed = False

    def sockets(self) -> tuple[socket.socket, socket.socket]:
        return self.peer, self.upstream


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the peer sees the connection die, not a clean end."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Forwarder:
    """Relays ``127.0.0.1:<port>`` to ``target`` under a :class:`LinkState`. Thread-safe.

    ``target`` may be set later (or changed: a restarted broker on a new port); while it is
    None, connections are refused (closed at once). ``name`` appears in logs and the report.
    """

    def __init__(self, name: str, target: tuple[str, int] | None = None, *, listen: tuple[str, int] = ("127.0.0.1", 0),
                 buffer_bytes: int = 4 << 20, clock: Clock | None = None, seed: int | None = None) -> None:
        self.name = name
        self._clock = clock or SystemClock()
        self._random = random.Random(seed)
        self._buffer_bytes = buffer_bytes
        self._lock = threading.Lock()
        self._target = target
        self._state = LinkState()
        self._listener = socket.create_server(listen, backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._pipes: list[_Pipe] = []
        self._drop_requested = False
        self._stopping = False
        self.accepted = 0
        self.bytes_relayed = 0
        self._thread = threading.Thread(target=self._run, name=f"chaos-forwarder-{name}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def state(self) -> LinkState:
        with self._lock:
            return self._state

    @property
    def target(self) -> tuple[str, int] | None:
        with self._lock:
            return self._target

    def retarget(self, target: tuple[str, int] | None) -> None:
        """New connections go to ``target`` from now on (open ones stay where they are)."""
        self._change(target=target)

    def set_state(self, state: LinkState) -> None:
        self._change(state=state)

    def freeze(self) -> None:
        self.set_state(LinkState(frozen=True))

    def delay(self, seconds: float) -> None:
        self.set_state(LinkState(delay_s=seconds))

    def lose(self, fraction: float, retransmit_s: float = 0.2) -> None:
        self.set_state(LinkState(loss=fraction, retransmit_s=retransmit_s))

    def blackhole(self, fraction: float) -> None:
        self.set_state(LinkState(blackhole=fraction))

    def heal(self) -> None:
        """Pass everything again; held bytes flow, blackholed connections are closed."""
        self.set_state(LinkState())

    def drop(self) -> None:
        """Close every open connection with a reset (peers reconnect, through this forwarder)."""
        with self._lock:
            self._drop_requested = True
        self._wake()

    def open_connections(self) -> int:
        """Relayed connections now open (read from another thread: a snapshot)."""
        return sum(1 for pipe in list(self._pipes) if not pipe.closed)

    def buffered_bytes(self) -> int:
        """Bytes the forwarder holds that it has not passed on yet (a snapshot)."""
        return sum(d.queued for pipe in list(self._pipes) if not pipe.closed for d in pipe.directions)

    def stop(self) -> None:
        """Close every connection and the listener; the thread is joined. Idempotent."""
        with self._lock:
            self._stopping = True
        self._wake()
        self._thread.join()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the relay thread ---------------------------------------------------------------------

    def _change(self, **changes: object) -> None:
        with self._lock:
            if "target" in changes:
                self._target = changes["target"]  # type: ignore[assignment]
            if "state" in changes:
                self._state = changes["state"]  # type: ignore[assignment]
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # stopped, or the wake-up pipe is full: the loop wakes anyway

    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except Exception:
            log.exception("chaos forwarder failed; its link is cut", forwarder=self.name)
        finally:
            for pipe in self._pipes:
                self._close(pipe, reset=True)
            self._pipes.clear()
            self._listener.close()

    def _loop_once(self) -> bool:
        with self._lock:
            if self._stopping:
                return False
            state, drop = self._state, self._drop_requested
            self._drop_requested = False
        if drop:
            for pipe in self._pipes:
                self._close(pipe, reset=True)
        if not state.blackhole:
            for pipe in self._pipes:
                if pipe.blackholed:
                    self._close(pipe, reset=True)
        self._pipes = [pipe for pipe in self._pipes if not pipe.closed]
        now = self._clock.now()
        timeout = self._register(state, now)
        for key, events in self._selector.select(timeout):
            if key.fileobj is self._wake_r:
                self._drain_wake()
            elif key.fileobj is self._listener:
                self._accept()
            else:
                pipe = key.data
                if not pipe.closed:
                    self._service(pipe, key.fileobj, events)
        # A change made while the selector waited applies to every byte read after it: read it again.
        if not self.state.frozen:
            now = self._clock.now()
            for pipe in self._pipes:
                if not pipe.closed and pipe.connected:
                    self._flush(pipe, now)
        return True

    def _register(self, state: LinkState, now: float) -> float | None:
        """Set what the selector waits for; returns how long it may wait (None: until an event)."""
        wanted: dict[socket.socket, tuple[int, object]] = {self._wake_r: (selectors.EVENT_READ, None)}
        if not state.frozen:
            wanted[self._listener] = (selectors.EVENT_READ, None)
        next_release: float | None = None
        for pipe in self._pipes:
            if pipe.closed:
                continue
            if not pipe.connected:
                wanted[pipe.upstream] = (selectors.EVENT_WRITE, pipe)
                continue
            if state.frozen or pipe.blackholed:
                continue
            masks, release = self._pipe_masks(pipe, now)
            if release is not None:
                next_release = release if next_release is None else min(next_release, release)
            for sock, mask in masks.items():
                if mask:
                    wanted[sock] = (mask, pipe)
        registered = self._selector.get_map()
        for stale in [key.fileobj for key in list(registered.values()) if key.fileobj not in wanted]:
            self._selector.unregister(stale)
        for sock, (mask, data) in wanted.items():
            if sock in registered:
                self._selector.modify(sock, mask, data)
            else:
                self._selector.register(sock, mask, data)
        return None if next_release is None else max(0.0, next_release - now)

    def _pipe_masks(self, pipe: _Pipe, now: float) -> tuple[dict[socket.socket, int], float | None]:
        """What a connected pipe's two sockets wait for, and when its next held-back bytes are due."""
        masks = {pipe.peer: 0, pipe.upstream: 0}
        next_release: float | None = None
        for direction in pipe.directions:
            if not direction.ended and direction.queued < self._buffer_bytes:
                masks[direction.source] |= selectors.EVENT_READ
            if direction.queue:
                release = direction.queue[0][0]
                if release <= now:
                    masks[direction.sink] |= selectors.EVENT_WRITE
                else:
                    next_release = release if next_release is None else min(next_release, release)
        return masks, next_release

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        with self._lock:
            state, target = self._state, self._target
        if state.frozen:
            return
        try:
            peer, _ = self._listener.accept()
        except BlockingIOError:
            return
        peer.setblocking(False)
        self.accepted += 1
        if target is None:
            _reset(peer)  # nothing behind the forwarder: as if the port were closed
            return
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        code = upstream.connect_ex(target)
        if code not in (0, errno.EINPROGRESS):
            _reset(peer)
            upstream.close()
            return
        blackholed = state.blackhole > 0 and self._random.random() < state.blackhole
        self._pipes.append(_Pipe(peer, upstream, blackholed=blackholed))

    def _service(self, pipe: _Pipe, sock: object, events: int) -> None:
        if not pipe.connected:
            if pipe.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._close(pipe, reset=True)  # the target refused: so does the forwarder
                return
            pipe.connected = True
            for each in pipe.sockets():
                each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return
        if events & selectors.EVENT_READ:
            direction = pipe.directions[0] if sock is pipe.peer else pipe.directions[1]
            self._read(pipe, direction)

    def _read(self, pipe: _Pipe, direction: _Direction) -> None:
        state = self.state
        if state.frozen or pipe.blackholed:
            return
        try:
            chunk = direction.source.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._close(pipe, reset=True)
            return
        release = self._clock.now() + state.delay_s
        if chunk and state.loss and self._random.random() < state.loss:
            release += state.retransmit_s
        if not chunk:
            direction.ended = True
        direction.push(release, chunk)

    def _flush(self, pipe: _Pipe, now: float) -> None:
        for direction in pipe.directions:
            while direction.due(now):
                chunk = direction.queue[0][1]
                if not chunk:  # the source ended: so does the other side, once all before it went
                    self._close(pipe, reset=False)
                    return
                try:
                    sent = direction.sink.send(chunk)
                except BlockingIOError:
                    break
                except OSError:
                    self._close(pipe, reset=True)
                    return
                self.bytes_relayed += sent
                direction.queued -= sent
                if sent < len(chunk):
                    direction.queue[0] = (direction.queue[0][0], chunk[sent:])
                    break
                direction.queue.popleft()

    def _close(self, pipe: _Pipe, *, reset: bool) -> None:
        if pipe.closed:
            return
        pipe.closed = True
        for sock in pipe.sockets():
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            if reset:
                _reset(sock)
            else:
                sock.close()
