"""``plugmq bench failover``: kill -9 of the elected master, per replication mode.

A real ZooKeeper (from its jar) and two ``plugmq serve`` children of one broker name with
``[broker] failover = true`` (ha and cluster_zk; ``min_in_sync_replicas = 1``), sessions timing
out after ``--session-timeout`` s. ``--threads`` threads of the official Python client's producer
send unique bodies to the master, one at a time, for ``--steady`` s; the master reports its
replication lag, then is killed with SIGKILL. Measured per round (plugmq.testing.failover):

* failover time: from the kill until a SendMessage straight to the other broker succeeds
  (probed every 10 ms: the session timeout, the election, the promotion); then the official
  producer, routed afresh, sends there too (routed s: from the kill);
* acked-message loss: bodies acked by the producers that the new master does not hold, beside
  the lag (messages) the old master last reported and the sends acked after that report;
* the old master restarted: time until it follows the new master as a caught-up slave.

The baseline is the steady send rate of each round (no failure), and sync double-write's rate is
given as a ratio to async's of the same run.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from plugmq.measure.probes import LoadWindow
from plugmq.testing import ZooKeeperServer, zookeeper_missing
from plugmq.testing.failover import KillRun, run_kill

__all__ = ["command"]


@click.command("failover")
@click.option("--rounds", default=2, show_default=True, help="kill -9 rounds per mode")
@click.option("--threads", default=8, show_default=True, help="producer threads (one send at a time each)")
@click.option("--steady", "steady_s", default=3.0, show_default=True, help="seconds of sends before each kill")
@click.option("--session-timeout", "session_timeout_s", default=2.0, show_default=True,
              help="cluster_zk session_timeout_s (seconds)")
@click.option("--mode", "modes", multiple=True, default=("sync_master", "async_master"), show_default=True,
              type=click.Choice(["sync_master", "async_master"]), help="replication modes to kill")
def command(rounds: int, threads: int, steady_s: float, session_timeout_s: float, modes: tuple[str, ...]) -> None:
    """Failover time and acked-message loss after kill -9 of the master, sync vs async double-write."""
    missing = zookeeper_missing()
    if missing:
        raise click.ClickException(f"plugmq bench failover needs a ZooKeeper server: {missing}")
    load = LoadWindow()
    runs: list[KillRun] = []
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-failover-") as directory:
        zookeeper = ZooKeeperServer(Path(directory) / "zookeeper")
        zookeeper.start()
        try:
            for round_ in range(rounds):
                for mode in modes:
                    where = Path(directory) / f"{mode}-{round_}"
                    runs.append(run_kill(where, zookeeper, mode=mode, threads=threads, steady_s=steady_s,
                                         session_timeout_s=session_timeout_s))
        finally:
            zookeeper.stop()
    load.finish()
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    table = Table(title=f"kill -9 of the master of 2 brokers: session timeout {session_timeout_s:g} s, {threads} "
                        "producer threads, sync sends, batch size 1, store_mmap default flush (async)")
    for column in ("mode", "steady msg/s", "failover s", "routed s", "acked", "lost", "last lag msgs", "acked after report",
                   "epoch old/new"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(run.mode, f"{run.steady_rate:,.0f}", f"{run.failover_s:.2f}", f"{run.routed_s:.2f}",
                      f"{len(run.acked):,}",
                      str(len(run.lost)), str(run.last_lag_messages), str(run.acked_after_report),
                      f"{run.old_epoch}/{run.new_epoch}")
    console.print(table)
    rates = {mode: statistics.median(r.steady_rate for r in runs if r.mode == mode) for mode in modes}
    if "sync_master" in rates and rates.get("async_master"):
        console.print(f"sync double-write steady rate / async: {rates['sync_master'] / rates['async_master']:.2f}x "
                      "(medians of the rounds)")
    console.print(load.text())
