"""``plugmq chaos``: check a plugin composition against faults under load (see plugmq.chaos)."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import click

__all__ = ["command"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@click.command("chaos")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--faults", default="kill", show_default=True,
              help="Comma-separated faults: kill, kill-master, suspend, partition-zk, partition-pair, loss, delay, "
                   "zk-down (OpenChaos names such as random-kill are accepted too).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1), help="Rounds of each fault.")
@click.option("--mode", default="sync", show_default=True, type=click.Choice(["sync", "async"]),
              help="Replication mode of the master: sync_master or async_master.")
@click.option("--brokers", default=2, show_default=True, type=click.IntRange(min=2),
              help="Brokers of the one broker name (a master and slaves).")
@click.option("--session-timeout", "session_timeout_s", default=2.0, show_default=True, type=click.FloatRange(min=1.0),
              help="cluster_zk session_timeout_s (seconds); faults last a few of them.")
@click.option("--steady", "steady_s", default=3.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Seconds of load before each fault.")
@click.option("--producers", default=4, show_default=True, type=click.IntRange(min=1), help="Producer threads.")
@click.option("--body-size", "body_bytes", default=0, show_default=True, type=click.IntRange(min=0),
              help="Pad each message body to this many bytes (0: just its unique name, about 8 bytes).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for history.jsonl, summary.json, report.md and timeline.png "
                   "(default: ./chaos-<mode>-<faults>).")
@click.option("--seed", type=int, default=None, help="Seed of the random choices (which broker a kill hits, losses).")
def command(config: Path, faults: str, rounds: int, mode: str, brokers: int, session_timeout_s: float, steady_s: float,
            producers: int, body_bytes: int, out: Path | None, seed: int | None) -> None:
    """Run CONFIG's plugin composition as a failover cluster (ZooKeeper and BROKERS `plugmq serve`
    children on loopback), drive it with the official Python client, inject FAULTS in rounds, and
    check every acknowledged message.

    Exits 1 when an acknowledged message was lost or redelivered after an OK ack (for CI).
    """
    from plugmq.chaos.runner import run_chaos

    # The official client fails calls through futures whose callbacks raise while brokers are down;
    # concurrent.futures logs each with a traceback. The history records every failed call already.
    logging.getLogger("concurrent.futures").setLevel(logging.CRITICAL)
    # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so the brokers and ZooKeeper are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    names = [name.strip() for name in faults.split(",") if name.strip()]
    where = out or Path(f"chaos-{mode}-{'-'.join(names)}")
    result = run_chaos(config, faults=names, rounds=rounds, mode=mode, brokers=brokers,
                       session_timeout_s=session_timeout_s, out=where, seed=seed, steady_s=steady_s,
                       producers=producers, body_bytes=body_bytes)
    click.echo((where / "report.md").read_text(encoding="utf-8").split("![timeline]")[0].rstrip())
    click.echo(f"\nreport: {where / 'report.md'} (history: {where / 'history.jsonl'})")
    if not result.ok:
        click.echo("plugmq chaos: an acknowledged message was lost or redelivered after an OK ack", err=True)
        sys.exit(1)
