"""``plugmq send`` and ``plugmq consume``: a console producer and consumer.

Like every admin verb they run against a running ``plugmq serve`` (``--server``, its admin
endpoint) or a stopped broker's data dir (``--config``).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from plugmq.cli.admin import _emit, _render_messages, _Target, _target_options, _time_option, _when
from plugmq.cli.filter import parse_pairs

__all__ = ["consume", "send"]


@click.command("send")
@click.argument("topic")
@click.argument("body", required=False)
@click.option("--tags", help="The message's tag.")
@click.option("--key", "keys", multiple=True, help="A message key (repeat for more).")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE", help="A user property (repeatable).")
@click.option("--at", "deliver_at", help="Deliver at this time (a delayed message): epoch ms, ISO 8601 or "
                                         "yyyy-MM-dd#HH:mm:ss:SSS (local time).")
@click.option("--message-group", help="A FIFO message group (its messages keep their order).")
@click.option("--priority", type=click.IntRange(min=0), help="A priority (a [topics.<t>] priority topic).")
@click.option("--base64", "is_base64", is_flag=True, help="BODY (or stdin) is base64: send the bytes it encodes.")
@_target_options
def send(target: _Target, as_json: bool, topic: str, body: str | None, tags: str | None, keys: tuple[str, ...],
         properties: tuple[str, ...], deliver_at: str | None, message_group: str | None, priority: int | None,
         is_base64: bool) -> None:
    """Store one message with BODY (read from stdin when left out) on TOPIC and print where it went."""
    text = sys.stdin.read() if body is None else body
    at_ms = _time_option(deliver_at)
    if deliver_at is not None and at_ms is None:
        raise click.BadParameter("'now' is no delay; leave --at out", param_hint="--at")
    args: dict[str, Any] = {"topic": topic, "body": text, "body_encoding": "base64" if is_base64 else "utf-8",
                            "tags": tags, "keys": list(keys), "properties": parse_pairs(properties, "--property"),
                            "deliver_at_ms": at_ms, "message_group": message_group, "priority": priority}

    def render(result: dict[str, Any]) -> None:
        due = f", due at {_when(result['deliver_at_ms'])}" if result["deliver_at_ms"] is not None else ""
        click.echo(f"stored {result['unique_id'] or result['msg_id']} on {result['topic']} queue {result['queue_id']} "
                   f"offset {result['queue_offset']}{due} (msg id {result['msg_id']})")

    _emit(target.run("send-message", {k: v for k, v in args.items() if v is not None}), as_json, render)


@click.command("consume")
@click.argument("topic")
@click.option("--group", default="plugmq-console", show_default=True,
              help="The consumer group to read as: what it has not consumed yet.")
@click.option("-n", "--count", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="At most this many messages.")
@click.option("--from-now", is_flag=True,
              help="A group new to the topic starts at messages sent from now on (default: its first message).")
@click.option("--wait", "wait_s", type=click.FloatRange(0), default=0, show_default=True, metavar="SECONDS",
              help="When nothing is there, wait this long (at most 50) for a first message.")
@_target_options
def consume(target: _Target, as_json: bool, topic: str, group: str, count: int, from_now: bool,
            wait_s: float) -> None:
    """Read the next messages of TOPIC for a consumer group, and acknowledge them (they are consumed).

    Prints what is there now ("no messages" when nothing is), or with --wait what arrives within
    that many seconds (useful against a running plugmq serve)."""
    args = {"topic": topic, "group": group, "count": count, "from_first": not from_now, "wait_s": wait_s}
    _emit(target.run("consume-message", args), as_json, _render_messages)
