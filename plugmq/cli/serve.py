"""``plugmq serve``: serve a broker over RocketMQ 5's gRPC protocol until SIGINT / SIGTERM."""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from plugmq.broker.broker import Broker

__all__ = ["command"]


@click.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Broker TOML file ([broker], [plugins.*] and an optional [server] table).")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Address to listen on (overrides [server] listen; port 0 picks a free port).")
def command(config_path: str, listen: str | None) -> None:
    """Serve the broker to RocketMQ 5 clients (e.g. rocketmq-python-client) over gRPC.

    Prints one line 'plugmq serve: listening on HOST:PORT' once clients can connect. Then the
    objects made while starting are moved out of the cyclic garbage collector's reach
    (``gc.freeze()``): they live as long as the process, and a full collection no longer walks
    them while sends run. Only this command does it, never the library.
    """
    try:
        from plugmq.server import run
    except ModuleNotFoundError as exc:
        raise click.ClickException(f"plugmq serve needs the 'serve' extra ({exc.name} is missing): "
                                   "pip install 'plugmq[serve]'") from exc

    def ready(address: str, broker: Broker) -> None:
        click.echo(f"plugmq serve: listening on {address} (broker {broker.name}, data {broker.data_dir})")
        sys.stdout.flush()
        gc.freeze()  # the started broker's ~50k objects: each full collection walked them all

    run(config_path, listen, ready)  # a PlugmqError becomes one error line in plugmq.cli
