"""``plugmq query``: look messages up by id, by key, or a queue offset by time, in a broker's data dir."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.cli.layout import print_table
from plugmq.core.message import MessageQueue, StoredMessage

_config_option = click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                              required=True, help="The broker's config file (the broker must not be running).")


_COLUMNS = ("msg_id", "topic", "queue", "offset", "tags", "keys", "stored_ms", "body")


def _print(messages: list[StoredMessage], as_json: bool) -> None:
    rows = [{"msg_id": m.msg_id, "topic": m.topic, "queue": m.queue_id, "offset": m.queue_offset,
             "tags": m.tags, "keys": " ".join(m.keys), "stored_ms": m.store_timestamp_ms,
             "body": m.body.decode("utf-8", "replace")[:80], "properties": dict(m.user_properties)} for m in messages]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table()
    for column in _COLUMNS:
        # Identifiers whole; keys wrap between keys, never inside one; a body preview may fold anywhere.
        table.add_column(column, no_wrap=column not in ("keys", "body"), overflow="fold" if column == "body" else "ellipsis")
    for row in rows:
        table.add_row(*(str(row[c]) for c in _COLUMNS))
    print_table(table)


def _open(config_file: Path) -> Broker:
    return Broker.from_config(config_file)  # errors become one line in plugmq.cli


@click.group("query")
def command() -> None:
    """Query stored messages of a broker (by id, by key, offset by timestamp)."""


@command.command("id")
@_config_option
@click.argument("msg_id")
@click.option("--json", "as_json", is_flag=True)
def by_id(config_file: Path, msg_id: str, as_json: bool) -> None:
    """Find the message with offset message id MSG_ID (one read)."""
    with _open(config_file) as broker:
        found = broker.query_by_id(msg_id)
        if found is None:
            raise click.ClickException(f"no message with id {msg_id}")
        _print([found], as_json)


@command.command("key")
@_config_option
@click.argument("topic")
@click.argument("key")
@click.option("--max", "max_results", default=32, show_default=True)
@click.option("--begin-ms", default=0, show_default=True)
@click.option("--end-ms", default=None, type=int)
@click.option("--json", "as_json", is_flag=True)
def by_key(config_file: Path, topic: str, key: str, max_results: int, begin_ms: int, end_ms: int | None,
           as_json: bool) -> None:
    """Messages of TOPIC whose keys (or unique id) equal KEY, stored in [begin, end]."""
    with _open(config_file) as broker:
        _print(broker.query_by_key(topic, key, max_results=max_results, begin_ms=begin_ms, end_ms=end_ms), as_json)


@command.command("offset")
@_config_option
@click.argument("topic")
@click.argument("queue_id", type=int)
@click.argument("timestamp_ms", type=int)
def offset_by_time(config_file: Path, topic: str, queue_id: int, timestamp_ms: int) -> None:
    """The first offset of TOPIC's queue QUEUE_ID stored at or after TIMESTAMP_MS."""
    with _open(config_file) as broker:
        queue = MessageQueue(topic, broker.name, queue_id)
        click.echo(json.dumps({"topic": topic, "queue": queue_id, "timestamp_ms": timestamp_ms,
                               "offset": broker.offset_for_timestamp(queue, timestamp_ms),
                               "min_offset": broker.min_offset(queue), "max_offset": broker.max_offset(queue)}))
