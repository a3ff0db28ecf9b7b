"""Redis as the benchmarks' peer: a ``redis-server`` child on a free loopback port, persistence
off, started and stopped by the bench (``plugmq bench store``, ``delay`` and ``grpc`` share it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import click

__all__ = ["RedisServer", "redis_missing"]


def redis_missing() -> str | None:
    """Why the Redis baseline cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install 'plugmq[bench]')"
    return None


class RedisServer:
    """A redis-server child on a free loopback port, persistence off; stopped by ``stop()``."""

    def __init__(self, workdir: Path) -> None:
        import redis

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(400):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.025)  # the server process is starting to listen
        self.stop()
        raise click.ClickException(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
