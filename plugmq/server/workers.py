"""``[server] workers = N``: the front-end processes of ``plugmq serve`` and the owner's side of them.

The process that opens the broker (the owner) stops listening on the clients' port itself: it
serves its gRPC service on a Unix socket and takes checked sends on a second one
(plugmq.server.handoff), and starts N front-end processes (plugmq.server.frontend) that listen
on the port together (SO_REUSEPORT). The log keeps one writer, the owner; what grows with the
front-ends is the per-request work of gRPC (HTTP/2, protobuf, checks), which is most of a
request's cost. A front-end that dies is logged and started again; the owner stops them first
when it stops, so their calls in flight are answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.server.frontend import GRPC_SOCKET, HANDOFF_SOCKET

__all__ = ["Frontends", "remove_sockets", "reserve_port", "socket_dir"]

log = get_logger(__name__)

_READY_S = 60.0
_WATCH_S = 0.5
_RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


def socket_dir() -> Path:
    """A new directory for the owner's Unix sockets that only this user may enter (mode 0700)."""
    return Path(tempfile.mkdtemp(prefix="plugmq-serve-"))


def reserve_port(listen: str) -> tuple[socket.socket, str]:
    """Bind (without listening) a SO_REUSEPORT socket to ``listen``, so port 0 becomes a fixed free
    port the front-ends can all bind; returns it with the ``host:port`` it holds. The caller
    closes it once the front-ends listen."""
    host, _, port = listen.rpartition(":")
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot listen on {listen!r} ({exc}); pick another --listen host:port") from exc
    return sock, f"{host}:{sock.getsockname()[1]}"


class Frontends:
    """N front-end processes on ``address``, started, watched and stopped by the owner."""

    def __init__(self, count: int, config_path: Path, address: str, sockets: Path, max_body: int, *,
                 relay_sends: bool) -> None:
        self._count = count
        self._args = [sys.executable, "-c", "from plugmq.server.frontend import main; main()", str(config_path),
                      address, str(sockets), str(max_body), "1" if relay_sends else "0"]
        self.processes: list[asyncio.subprocess.Process] = []
        self._restarts = [0] * count
        self._stopping = False
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start every front-end and wait until each listens (ConfigError naming the failure)."""
        self.processes = list(await asyncio.gather(*(self._spawn(i) for i in range(self._count))))
        self._watcher = asyncio.ensure_future(self._watch())

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(*self._args, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), _READY_S)
        except TimeoutError:
            line = b""
        if not line.startswith(b"plugmq serve worker: listening on "):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await process.wait()
            raise ConfigError(f"front-end worker {index} of [server] workers did not start (exit code {code}); "
                              "its error is above")
        log.info("front-end worker listening", worker=index, pid=process.pid)
        return process

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(_WATCH_S)
            for index, process in enumerate(self.processes):
                if process.returncode is None or self._stopping:
                    continue
                delay = _RESTART_BACKOFF_S[min(self._restarts[index], len(_RESTART_BACKOFF_S) - 1)]
                log.warning("front-end worker exited; starting it again", worker=index, pid=process.pid,
                            exit_code=process.returncode, restart_in_s=delay)
                self._restarts[index] += 1
                await asyncio.sleep(delay)
                try:
                    self.processes[index] = await self._spawn(index)
                except ConfigError as exc:
                    log.error("front-end worker could not be started again", worker=index, error=str(exc))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every live front-end (SIGHUP: they read the ACL accounts again)."""
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every front-end (each answers its calls in flight), then wait; SIGKILL the late."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        for process in self.processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(self._reap(p, grace_s + 5.0) for p in self.processes))

    @staticmethod
    async def _reap(process: asyncio.subprocess.Process, timeout: float) -> None:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def remove_sockets(sockets: Path, names: Sequence[str] = (GRPC_SOCKET, HANDOFF_SOCKET)) -> None:
    """Remove the owner's socket directory (after its servers closed)."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (sockets / name).unlink()
    shutil.rmtree(sockets, ignore_errors=True)
