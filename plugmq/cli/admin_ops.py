"""More ``plugmq admin`` verbs: delayed messages (cancel, reschedule) and deletes.

They join the ``admin`` group of :mod:`plugmq.cli.admin` (which imports this module at its end)
and run against a running ``plugmq serve`` or a stopped data dir like every admin verb.
"""

from __future__ import annotations

from typing import Any

import click

from plugmq.cli.admin import _emit, _Target, _target_options, _time_option, _when, command

__all__: list[str] = []


@command.command("delay-cancel")
@click.argument("msg_id")
@_target_options
def delay_cancel(target: _Target, as_json: bool, msg_id: str) -> None:
    """Cancel the pending delayed message MSG_ID (the msg id its send returned, or a recall handle)."""
    def render(result: dict[str, Any]) -> None:
        click.echo(f"{result['msg_id']}: " + ("cancelled; it will not be delivered" if result["cancelled"] else
                                              "not cancelled: delivered already, moved, or unknown to this broker"))

    _emit(target.run("delay-cancel", {"id": msg_id}), as_json, render)


@command.command("delay-reschedule")
@click.argument("msg_id")
@click.option("--at", "when", required=True,
              help="The new deliver time: epoch ms, ISO 8601 or yyyy-MM-dd#HH:mm:ss:SSS (local time), or 'now'.")
@_target_options
def delay_reschedule(target: _Target, as_json: bool, msg_id: str, when: str) -> None:
    """Move the pending delayed message MSG_ID to another deliver time (delay_wheel, delay_schedule)."""
    from plugmq.core.clock import SystemClock

    at = _time_option(when)
    at_ms = SystemClock().now_ms() if at is None else at

    def render(result: dict[str, Any]) -> None:
        if result["moved"]:
            click.echo(f"{result['msg_id']}: due at {_when(result['deliver_at_ms'])}; its msg id is now "
                       f"{result['new_msg_id']}")
        else:
            click.echo(f"{result['msg_id']}: not moved: delivered already, cancelled, moved before, or unknown "
                       "to this broker")

    _emit(target.run("delay-reschedule", {"id": msg_id, "deliver_at_ms": at_ms}), as_json, render)


@command.command("group-delete")
@click.argument("group")
@_target_options
def group_delete(target: _Target, as_json: bool, group: str) -> None:
    """Delete consumer GROUP: its offsets, pop progress and messages in flight (messages stay)."""
    def render(result: dict[str, Any]) -> None:
        click.echo(f"group {result['group']} deleted on {result['broker']} "
                   f"(pop progress on {result['pop_queues']} queues forgotten)")

    _emit(target.run("group-delete", {"group": group}), as_json, render)


@command.command("topic-delete")
@click.argument("topic")
@click.option("--group-topic", is_flag=True,
              help="Allow deleting a group's retry (%RETRY%) or dead-letter (%DLQ%) topic.")
@_target_options
def topic_delete(target: _Target, as_json: bool, topic: str, group_topic: bool) -> None:
    """Delete TOPIC (RocketMQ's deleteTopic): it leaves the table and the routes, every group's
    offsets, pop progress and messages in flight on it go. Its records stay in the store until
    retention but are never served again, also not if TOPIC is created again. A topic declared
    for the cluster is deleted on every master of it."""
    def render(result: dict[str, Any]) -> None:
        click.echo(f"topic {result['topic']} deleted on {result['broker']} ({result['queues']} queues; "
                   f"{result['inflight_dropped']} messages in flight dropped)")
        if result["groups"]:
            click.echo(f"progress forgotten for groups: {', '.join(result['groups'])}")
        if result["connected"]:
            click.echo(f"warning: consumers of {', '.join(result['connected'])} are still connected", err=True)

    _emit(target.run("topic-delete", {"topic": topic, "group_topic": group_topic}), as_json, render)


def _render_limits(rows: list[dict[str, Any]]) -> None:
    from plugmq.cli.admin import _print_table, _table

    table = _table("Kind", "Name", "Messages/s", "Bytes/s", "Burst (s)")
    for row in rows:
        table.add_row(row["kind"], row["name"], "-" if row["messages_per_s"] is None else f"{row['messages_per_s']:g}",
                      "-" if row["bytes_per_s"] is None else f"{row['bytes_per_s']:g}", f"{row['burst_s']:g}")
    _print_table(table)


@command.command("rate-limits")
@_target_options
def rate_limits(target: _Target, as_json: bool) -> None:
    """The rate limits in force: per consumer group, topic and account."""
    _emit(target.run("rate-limits", {}), as_json, _render_limits)


@command.command("rate-limit")
@click.argument("kind", type=click.Choice(["group", "topic", "account"]))
@click.argument("name")
@click.option("--messages-per-s", type=float, help="Messages a second (leave out: no message limit).")
@click.option("--bytes-per-s", type=float, help="Body bytes a second (leave out: no byte limit).")
@click.option("--burst-s", type=float, default=1.0, show_default=True, help="Seconds of unused rate saved up.")
@_target_options
def rate_limit(target: _Target, as_json: bool, kind: str, name: str, messages_per_s: float | None,
               bytes_per_s: float | None, burst_s: float) -> None:
    """Set the rate limit of consumer group, topic or account NAME on a running broker (neither
    --messages-per-s nor --bytes-per-s: remove it). Until the broker restarts: [limits] in its config
    is where limits are kept."""
    args = {"kind": kind, "name": name, "messages_per_s": messages_per_s, "bytes_per_s": bytes_per_s,
            "burst_s": burst_s}
    _emit(target.run("rate-limit", args), as_json, _render_limits)
