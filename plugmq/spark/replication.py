"""A replicating plugin set's slave and the replication figures: lag while sending, catch-up time.

A plugin set with a replication plugin (``ha``) describes the master (``broker.role``:
``async_master`` or ``sync_master``); the runner starts its slave as a :class:`BrokerChild` with
the same plugins and options, ``role = "slave"``, ``broker_id = 1`` and the master's replication
address in the plugin's ``master`` option, and waits until the master sees it. While the workload
runs, :class:`ReplicationProbe` samples the master's replication status every ``interval_s``:

* ``replication_lag_bytes_*`` / ``replication_lag_messages_*``: the master's log end minus what
  the slave confirmed (mean and max over the samples taken in the measured period, warm-up
  excluded);
* ``replication_catch_up_ms``: from the moment the last send returned until the slave confirmed
  the log end as it was then;
* ``replication_unreplicated_bytes``: what the slave still lacked when the runner stopped
  waiting (must be 0).

Failover time is not measured: automatic failover is not part of the ``ha`` plugin yet.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugmq.measure.children import BrokerChild
from plugmq.spark.experiments import Experiment
from plugmq.spark.results import ExperimentResult
from plugmq.testing.wait import wait_for

__all__ = ["ReplicationProbe", "Status", "slave_config", "start_slave"]

Status = Callable[[], tuple[float, dict[str, Any]] | None]
"""The master's newest replication status: (``time.monotonic()`` it was taken, ``as_dict()``)."""

SLAVE_ID = 1


def slave_config(exp: Experiment, *, broker_name: str, master_address: str) -> dict[str, dict[str, Any]]:
    """The slave's ``broker.toml`` tables: the master's plugins and options, role slave, the master's address."""
    ps = exp.plugin_set
    assert ps.replication is not None, "only a replicating plugin set has a slave"
    broker = {k: v for k, v in ps.broker.items() if k != "role"}
    tables: dict[str, dict[str, Any]] = {
        "broker": {**broker, "name": broker_name, "data_dir": "data", "plugins": list(ps.plugins), "role": "slave",
                   "broker_id": SLAVE_ID}}
    options = exp.store_options()
    options.setdefault(ps.replication, {})["master"] = master_address
    for plugin, table in options.items():
        tables[f"plugins.{plugin}"] = dict(table)
    tables["server"] = {"long_polling_s": 1.0}
    return tables


def start_slave(directory: Path, exp: Experiment, *, broker_name: str, master_address: str) -> BrokerChild:
    """The slave of a master whose replication listens on ``master_address``, in a child process."""
    return BrokerChild.from_tables(directory, slave_config(exp, broker_name=broker_name, master_address=master_address))


def _lag_messages(status: dict[str, Any]) -> int | None:
    slaves = status.get("slaves") or []
    counted = [s.get("lag_messages") for s in slaves if s.get("lag_messages") is not None]
    return min(counted) if counted else None


class ReplicationProbe:
    """Samples a master's replication status on a thread of its own while the workload runs."""

    def __init__(self, status: Status, elapsed: Callable[[], float], interval_s: float = 0.05) -> None:
        self._status = status
        self._elapsed = elapsed
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int | None]] = []  # (elapsed, lag bytes, lag messages)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.catch_up_s: float | None = None
        self.unreplicated_bytes: int | None = None

    def wait_for_slave(self, timeout_s: float = 60.0) -> None:
        """Until the master counts a connected slave; :class:`WaitTimeout` (with the last status) after ``timeout_s``."""
        wait_for(self._status, timeout_s, "the master to count a connected slave",
                 until=lambda got: got is not None and bool(got[1].get("slaves")), interval=0.02)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._sample, daemon=True, name="plugmq-replication-probe")
        self._thread.start()

    def _sample(self) -> None:
        last = -1.0
        while not self._stop.wait(self.interval_s):
            got = self._status()
            if got is None or got[0] == last:
                continue  # no new status since the last sample
            last = got[0]
            self.samples.append((self._elapsed(), int(got[1].get("lag_bytes", 0)), _lag_messages(got[1])))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def catch_up(self, timeout_s: float) -> None:
        """Wait until the slave confirmed the log end as it is now; sets ``catch_up_s`` and
        ``unreplicated_bytes`` (what it still lacked at the end of the wait)."""
        began = time.monotonic()
        deadline = began + timeout_s
        end: int | None = None
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            got = self._status()
            if got is not None and got[0] >= began:
                status = got[1]
                if end is None:
                    end = int(status.get("end_offset", 0))
                if int(status.get("confirmed_offset", 0)) >= end and status.get("slaves"):
                    self.catch_up_s = max(0.0, got[0] - began)
                    self.unreplicated_bytes = 0
                    return
            time.sleep(0.005)
        self.unreplicated_bytes = max(0, (end or 0) - int(status.get("confirmed_offset", 0))) if end is not None else None

    def finish(self, result: ExperimentResult, timeout_s: float, measure_from: float, measure_to: float) -> None:
        """After the producers stopped: wait for the slave to catch up, stop sampling, record the figures."""
        self.catch_up(timeout_s)
        self.stop()
        self.figures(result, measure_from, measure_to)

    def figures(self, result: ExperimentResult, measure_from: float, measure_to: float) -> None:
        window = [s for s in self.samples if measure_from <= s[0] <= measure_to]
        result.metric("replication_samples", len(window), "")
        if window:
            lag_bytes = [s[1] for s in window]
            result.metric("replication_lag_bytes_mean", statistics.fmean(lag_bytes), "B")
            result.metric("replication_lag_bytes_max", max(lag_bytes), "B")
            counted = [s[2] for s in window if s[2] is not None]
            if counted:
                result.metric("replication_lag_messages_mean", statistics.fmean(counted), "msg")
                result.metric("replication_lag_messages_max", max(counted), "msg")
        if self.catch_up_s is not None:
            result.metric("replication_catch_up_ms", self.catch_up_s * 1000, "ms")
        result.metric("replication_unreplicated_bytes", self.unreplicated_bytes, "B")
