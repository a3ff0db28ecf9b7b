"""A Spark standalone cluster on this machine, from the pip-installed pyspark: master plus workers.

The pip package has no ``sbin/start-master.sh``, but its ``bin/spark-class`` runs the daemons::

    SPARK_HOME=<pyspark package dir> SPARK_LOCAL_IP=127.0.0.1 \\
        $SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 0 --webui-port 0
    ... org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port 0 --webui-port 0 --cores 1 \\
        --memory 1g --work-dir <dir> spark://127.0.0.1:<port>

Without ``--host 127.0.0.1`` a worker binds a non-loopback address; without ``--work-dir`` it
writes into the installed package. Port 0 lets each daemon pick a free port; the master's is read
from its log. Used by the tests (a session fixture) and ``python -m plugmq.spark.standalone``, which
starts one for measuring and prints its URL.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from plugmq.core.errors import PlugmqError

__all__ = ["StandaloneCluster", "spark_home"]

_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.\-]+:\d+)")
_REGISTERED = "Successfully registered with master"


def spark_home() -> Path:
    """The pyspark package directory, which is a complete SPARK_HOME (jars, bin/spark-class)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """``workers`` workers of ``cores`` cores each, on ``host``, everything under ``work_dir``."""

    def __init__(self, work_dir: Path, *, workers: int = 1, cores: int = 1, memory: str = "1g",
                 host: str = "127.0.0.1", python: str = sys.executable, start_timeout_s: float = 120.0) -> None:
        self.work_dir = Path(work_dir).resolve()  # the daemons run in it: no path relative to ours
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.host = host
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.master_url = ""
        self._processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP=self.host, SPARK_DAEMON_MEMORY="256m",
                   SPARK_LOG_DIR=str(self.work_dir / "logs"), SPARK_LOCAL_DIRS=str(self.work_dir / "local"),
                   PYSPARK_PYTHON=self.python,
                   # The master's REST submission server would take the fixed port 6066.
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        return env

    def _spawn(self, name: str, cls: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work_dir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), cls, *args], stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env(),
                                       cwd=self.work_dir, start_new_session=True)
        self._processes.append((name, process, log))
        return process, log

    def _wait_for(self, name: str, process: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str] | str,
                  deadline: float) -> str:
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            found = pattern.search(text) if isinstance(pattern, re.Pattern) else (pattern if pattern in text else None)
            if found is not None:
                return found.group(1) if isinstance(found, re.Match) else found
            if process.poll() is not None:
                raise PlugmqError(f"the Spark {name} exited with status {process.returncode} before it was ready; "
                                  f"its log ({log}) ends:\n{text[-3000:]}")
            time.sleep(0.2)
        raise PlugmqError(f"the Spark {name} was not ready after {self.start_timeout_s:g} s (a loaded machine? "
                          f"raise start_timeout_s); its log: {log}")

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker has registered."""
        for sub in ("logs", "local"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            master, log = self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", self.host,
                                      "--port", "0", "--webui-port", "0")
            self.master_url = self._wait_for("master", master, log, _MASTER_URL, deadline)
            started = []
            for i in range(self.workers):
                worker_dir = self.work_dir / f"worker-{i}"
                worker_dir.mkdir(exist_ok=True)
                started.append(self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", self.host,
                                           "--port", "0", "--webui-port", "0", "--cores", str(self.cores),
                                           "--memory", self.memory, "--work-dir", str(worker_dir), self.master_url))
            for i, (process, log) in enumerate(started):
                self._wait_for(f"worker-{i}", process, log, _REGISTERED, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the workers (which stop their executors), then the master; SIGKILL what lingers."""
        for _, process, _ in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process, _ in reversed(self._processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    """``python -m plugmq.spark.standalone WORK_DIR [WORKERS] [CORES]``: run a loopback cluster until Ctrl-C."""
    if not argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    cluster = StandaloneCluster(Path(argv[0]), workers=int(argv[1]) if len(argv) > 1 else 1,
                                cores=int(argv[2]) if len(argv) > 2 else 1)
    with cluster:
        print(cluster.master_url, flush=True)
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main(sys.argv[1:]))
