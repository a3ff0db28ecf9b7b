"""A standalone Apache ZooKeeper on a loopback port, its data in a directory of the caller's.

Debian's ``zookeeper`` package (3.8) runs as ``java -cp /usr/share/java/zookeeper.jar:<conf dir>
org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg``; the jar's manifest names the other
jars it needs. Tests use it through a fixture that skips with :func:`zookeeper_missing`'s reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Self

__all__ = ["DEFAULT_JAR", "ZooKeeperServer", "free_port", "zookeeper_missing"]

DEFAULT_JAR = Path(os.environ.get("PLUGMQ_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def zookeeper_missing(jar: Path = DEFAULT_JAR) -> str | None:
    """Why a ZooKeeper server cannot be started here (None when it can)."""
    if shutil.which("java") is None:
        return "Java is not installed (apt-get install openjdk-17-jre-headless)"
    if not jar.is_file():
        return f"ZooKeeper is not installed: {jar} is missing (apt-get install zookeeper)"
    return None


def free_port() -> int:
    """A loopback TCP port free now (another process may take it before the caller binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    """ZooKeeper's ``srvr`` four-letter command answers once the server serves."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            connection.sendall(b"srvr")
            return b"Zookeeper version" in connection.recv(4096)
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone server: ``start()`` returns its ``hosts`` string, ``stop()`` ends it.

    ``tick_ms`` is ZooKeeper's tickTime: sessions expire within about one tick of their timeout.
    Session timeouts from 1 s to 60 s are granted. ``stop()`` then ``start()`` restarts it on the
    same port with the same data (sessions that outlive the downtime survive it).
    """

    def __init__(self, directory: Path, *, tick_ms: int = 200, jar: Path = DEFAULT_JAR) -> None:
        self.directory = Path(directory)
        self.tick_ms = tick_ms
        self.jar = jar
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def hosts(self) -> str:
        if self.port is None:
            raise RuntimeError("ZooKeeper is not started")
        return f"127.0.0.1:{self.port}"

    def _write_config(self, port: int) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\ndataDir={data}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n"
            "4lw.commands.whitelist=srvr,ruok\n", encoding="utf-8")
        return config

    def start(self, timeout_s: float = 60.0) -> str:
        missing = zookeeper_missing(self.jar)
        if missing:
            raise RuntimeError(missing)
        self.directory.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):  # another process may take the free port before Java binds it
            port = self.port or free_port()
            config = self._write_config(port)
            self._log = open(self.directory / "zookeeper.log", "ab")  # noqa: SIM115 - closed in stop()
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", f"{self.jar}:{config.parent}", _MAIN, str(config)],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.process.poll() is None:
                if _answers(port):
                    self.port = port
                    return self.hosts
                time.sleep(0.1)
            self.stop()
            if self.port is not None:
                break  # a restart on a fixed port: trying another port would lose the clients
        raise RuntimeError(f"ZooKeeper did not start; see {self.directory / 'zookeeper.log'}")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the server (``signum``, then SIGKILL after 10 s). Idempotent. SIGKILL is a crash:
        ``start()`` then recovers it from its data directory, on the same port."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
