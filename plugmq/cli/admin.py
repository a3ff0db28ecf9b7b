"""``plugmq admin``: operate a broker, running (``--server HOST:PORT``, the admin endpoint of
``plugmq serve``) or stopped (``--config FILE``, its data dir opened here).

The verbs are RocketMQ mqadmin's topicList, topicStatus, updateTopic, consumerProgress,
queryMsgById/ByKey, resetOffsetByTime, plus resend-dlq and broker-status; the work is
:mod:`plugmq.admin`'s either way. Output is a table for people, or ``--json`` for scripts.
In a terminal a table keeps within its width without breaking an id across lines
(:mod:`plugmq.cli.layout`); into a pipe it is as wide as its content needs, a row a line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from plugmq.cli.layout import print_table
from plugmq.core.errors import PlugmqError, StoreError, ValidationError

__all__ = ["command"]


# ---------------------------------------------------------------------------------------------- where
class _Target:
    """Where the verb runs: a running server, or a stopped data dir."""

    def __init__(self, server: str | None, config: Path | None, access_key: str | None,
                 secret_key: str | None, tls: Mapping[str, str | None] | None = None) -> None:
        if (server is None) == (config is None):
            raise click.UsageError("give --server HOST:PORT (a running plugmq serve) or --config FILE (a stopped "
                                   "broker's config), exactly one of them")
        self.server, self.config = server, config
        self.access_key, self.secret_key = access_key, secret_key
        self.tls = tls  # ClientTls.from_files arguments, None for a plain channel

    def run(self, verb: str, args: Mapping[str, Any]) -> Any:
        try:
            if self.server is not None:
                return self._remote(verb, args)
            return self._local(verb, args)
        except PlugmqError as exc:
            raise click.ClickException(str(exc)) from exc

    def run_cluster(self, verb: str, args: Mapping[str, Any]) -> Any:
        """A cluster verb: through the server's session, or a session of the config's cluster."""
        try:
            if self.server is not None:
                return self._remote(verb, args)
            return self._local_cluster(verb, args)
        except PlugmqError as exc:
            raise click.ClickException(str(exc)) from exc

    def _local_cluster(self, verb: str, args: Mapping[str, Any]) -> Any:
        from plugmq.admin.cluster import ClusterAdmin, execute_cluster
        from plugmq.admin.cluster_session import open_cluster_service
        from plugmq.config.broker import load_config

        assert self.config is not None
        cluster_name = load_config(self.config).cluster_name
        service = open_cluster_service(self.config)  # ConfigError when the config names no cluster
        try:
            assert cluster_name is not None
            return execute_cluster(ClusterAdmin(service, cluster_name), verb, args)
        finally:
            service.close()

    def _remote(self, verb: str, args: Mapping[str, Any]) -> Any:
        try:
            from plugmq.server.admin import AdminClient
        except ModuleNotFoundError as exc:
            raise click.ClickException(f"plugmq admin --server needs the 'serve' extra ({exc.name} is missing): "
                                       "pip install 'plugmq[serve]'") from exc
        from plugmq.server.tls import ClientTls

        assert self.server is not None
        tls = ClientTls.from_files(**self.tls) if self.tls is not None else None
        with AdminClient(self.server, access_key=self.access_key, secret_key=self.secret_key, tls=tls) as client:
            return client.call(verb, args)

    def _local(self, verb: str, args: Mapping[str, Any]) -> Any:
        from plugmq.admin import BrokerAdmin, execute
        from plugmq.broker.broker import Broker

        assert self.config is not None
        try:
            broker = Broker.from_config(self.config)
        except StoreError as exc:
            raise StoreError(f"{exc} (if plugmq serve runs on this data dir, ask it: --server HOST:PORT instead "
                             "of --config)") from exc
        with broker:
            return execute(BrokerAdmin(broker), verb, args)


def _target_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options every verb takes: where, credentials, --json."""
    options = [
        click.option("--server", metavar="HOST:PORT", envvar="PLUGMQ_ADMIN_SERVER",
                     help="A running plugmq serve (its --listen address). Env: PLUGMQ_ADMIN_SERVER."),
        click.option("--config", "config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="A stopped broker's config file (its data dir is opened here)."),
        click.option("--access-key", envvar="PLUGMQ_ACCESS_KEY", help="Access key when the server's ACL is on."),
        click.option("--secret-key", envvar="PLUGMQ_SECRET_KEY", help="Its secret key."),
        click.option("--tls", "use_tls", is_flag=True, envvar="PLUGMQ_ADMIN_TLS",
                     help="Reach a server with [server.tls] (the system's CAs unless --tls-ca)."),
        click.option("--tls-ca", type=click.Path(dir_okay=False), envvar="PLUGMQ_ADMIN_TLS_CA",
                     help="PEM CA that signed the server's certificate (implies --tls)."),
        click.option("--tls-cert", type=click.Path(dir_okay=False), envvar="PLUGMQ_ADMIN_TLS_CERT",
                     help="PEM client certificate, for a server that checks clients (mutual TLS)."),
        click.option("--tls-key", type=click.Path(dir_okay=False), envvar="PLUGMQ_ADMIN_TLS_KEY",
                     help="Its PEM private key."),
        click.option("--tls-server-name", envvar="PLUGMQ_ADMIN_TLS_SERVER_NAME",
                     help="Name to check the server's certificate against, when HOST is not in it."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of a table."),
    ]
    for option in reversed(options):
        function = option(function)

    @functools.wraps(function)
    def wrapper(server: str | None, config: Path | None, access_key: str | None, secret_key: str | None,
                use_tls: bool, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                tls_server_name: str | None, as_json: bool, **kwargs: Any) -> None:
        files = {"ca": tls_ca, "cert": tls_cert, "key": tls_key, "server_name": tls_server_name}
        tls = files if use_tls or any(files.values()) else None
        target = _Target(server, config, access_key, secret_key, tls)
        function(target=target, as_json=as_json, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------------------------- output
_WRAPPED = ("Body", "Details", "Keys", "Topics", "Value")


def _print_table(table: Table) -> None:
    """Print ``table`` for a person: within the terminal's width, an id never broken (see
    :mod:`plugmq.cli.layout`); into a pipe, as wide as its content needs, a row a line."""
    console = Console(highlight=False, soft_wrap=False)
    if console.is_terminal:
        print_table(table, console)
        return
    needed = Measurement.get(console, console.options.update(max_width=1 << 16), table).maximum
    Console(highlight=False, width=needed, soft_wrap=False).print(table)


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        # Free text wraps between words (and a body preview folds); every other column is an id.
        table.add_column(column, no_wrap=column not in _WRAPPED, overflow="fold" if column == "Body" else "ellipsis")
    return table


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def _emit(result: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=False))
    else:
        render(result)


def _time_option(value: str | None) -> int | None:
    from plugmq.admin import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValidationError as exc:
        raise click.BadParameter(str(exc)) from exc


# ---------------------------------------------------------------------------------------------- verbs
@click.group("admin")
def command() -> None:
    """Operate a broker: topics, consumer progress, message queries, offset resets, dead letters.

    Every verb runs against a running plugmq serve (--server HOST:PORT) or a stopped broker's data
    dir (--config FILE), and prints a table, or JSON with --json.
    """


@command.command("topic-list")
@_target_options
def topic_list(target: _Target, as_json: bool) -> None:
    """Every topic: kind, queues and the messages they hold."""
    def render(rows: list[dict[str, Any]]) -> None:
        table = _table("Topic", "Kind", "Queues", "Messages")
        for row in rows:
            table.add_row(row["topic"], row["kind"], str(row["queues"]), str(row["messages"]))
        _print_table(table)

    _emit(target.run("topic-list", {}), as_json, render)


@command.command("topic-status")
@click.argument("topic")
@_target_options
def topic_status(target: _Target, as_json: bool, topic: str) -> None:
    """Min and max offset and the last store time of each queue of TOPIC."""
    def render(status: dict[str, Any]) -> None:
        table = _table("QID", "Min Offset", "Max Offset", "Last Updated",
                       title=f"{status['topic']} on broker {status['broker']}")
        for q in status["queues"]:
            table.add_row(str(q["queue_id"]), str(q["min_offset"]), str(q["max_offset"]), _when(q["last_store_ms"]))
        _print_table(table)

    _emit(target.run("topic-status", {"topic": topic}), as_json, render)


@command.command("update-topic")
@click.argument("topic")
@click.option("--queues", "-q", "queue_count", type=int, required=True, help="Queue count (created or grown to).")
@click.option("--cluster", "-c", "cluster", metavar="NAME",
              help="Create it on every master of cluster NAME (the broker given belongs to it).")
@_target_options
def update_topic(target: _Target, as_json: bool, topic: str, queue_count: int, cluster: str | None) -> None:
    """Create TOPIC with --queues queues, or grow it to that many (topics never shrink).

    With --cluster NAME the topic is declared for the whole cluster: every live master creates it
    (and a master that joins later), and the command says which masters have it so far.
    """
    if cluster is not None:
        def render_cluster(update: dict[str, Any]) -> None:
            previous = update["previous"]
            what = "declared" if previous is None else f"grown from {previous} to"
            click.echo(f"topic {update['topic']} {what} {update['queue_count']} queues in cluster {update['cluster']}")
            click.echo(f"created on: {', '.join(update['applied']) or 'no master yet'}")
            if update["pending"]:
                click.echo(f"not yet on: {', '.join(update['pending'])} (they create it when they see the "
                           "declaration)")

        result = target.run_cluster("cluster-update-topic",
                                    {"topic": topic, "queue_count": queue_count, "cluster": cluster})
        _emit(result, as_json, render_cluster)
        return

    def render(update: dict[str, Any]) -> None:
        previous, count = update["previous"], update["queue_count"]
        if previous is None:
            click.echo(f"created topic {update['topic']} with {count} queues")
        elif previous == count:
            click.echo(f"topic {update['topic']} already has {count} queues; nothing changed")
        else:
            click.echo(f"topic {update['topic']} grown from {previous} to {count} queues")

    _emit(target.run("update-topic", {"topic": topic, "queue_count": queue_count}), as_json, render)


@command.command("consumer-progress")
@click.argument("group", required=False)
@_target_options
def consumer_progress(target: _Target, as_json: bool, group: str | None) -> None:
    """Per queue: broker offset, consumer offset, in-flight messages, lag. Without GROUP: every group."""
    def render_groups(rows: list[dict[str, Any]]) -> None:
        table = _table("Group", "Modes", "Queues", "Lag", "In Flight")
        for row in rows:
            table.add_row(row["group"], ",".join(row["modes"]), str(row["queues"]), str(row["lag"]),
                          str(row["inflight"]))
        _print_table(table)

    def render(progress: dict[str, Any]) -> None:
        table = _table("Topic", "QID", "Mode", "Broker Offset", "Consumer Offset", "In Flight", "Lag",
                       "Oldest Pending", title=f"consumer group {progress['group']} on broker {progress['broker']}")
        for q in progress["queues"]:
            table.add_row(q["topic"], str(q["queue_id"]), q["mode"], str(q["broker_offset"]),
                          str(q["consumer_offset"]), str(q["inflight"]), str(q["lag"]), _when(q["oldest_pending_ms"]))
        _print_table(table)
        click.echo(f"Lag total: {progress['lag']}  In flight: {progress['inflight']}  "
                   f"Push consumers here: {', '.join(progress['members']) or 'none'}")

    result = target.run("consumer-progress", {"group": group})
    _emit(result, as_json, render_groups if group is None else render)


def _render_messages(messages: list[dict[str, Any]]) -> None:
    if not messages:
        click.echo("no messages")
        return
    if len(messages) == 1:
        m = messages[0]
        table = _table("Field", "Value")
        for name, value in (("Msg Id", m["msg_id"]), ("Unique Id", m["unique_id"] or "-"), ("Topic", m["topic"]),
                            ("Queue Id", m["queue_id"]), ("Queue Offset", m["queue_offset"]),
                            ("Tags", m["tags"] or "-"), ("Keys", " ".join(m["keys"]) or "-"),
                            ("Born", _when(m["born_ms"])), ("Stored", _when(m["stored_ms"])),
                            ("Reconsume Times", m["reconsume_times"]), ("Born Host", m["born_host"]),
                            ("Store Host", m["store_host"]), ("Size", m["size"])):
            table.add_row(name, str(value))
        for key, value in sorted(m["properties"].items()):
            table.add_row(f"Property {key}", value)
        table.add_row(f"Body ({m['body_encoding']})", Text(_preview(m["body"], 200), overflow="fold"))
        _print_table(table)
        return
    table = _table("Msg Id", "Unique Id", "Topic", "QID", "Offset", "Tags", "Keys", "Stored", "Reconsume", "Body")
    for m in messages:
        table.add_row(m["msg_id"], m["unique_id"] or "-", m["topic"], str(m["queue_id"]), str(m["queue_offset"]),
                      m["tags"] or "-", " ".join(m["keys"]) or "-", _when(m["stored_ms"]), str(m["reconsume_times"]),
                      _preview(m["body"], 40))
    _print_table(table)


def _preview(text: str, limit: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[:limit] + "..."


@command.command("query-msg")
@click.option("--id", "message_id", help="An offset message id, or a client message id (unique key).")
@click.option("--key", help="A message key (needs --topic).")
@click.option("--time", "begin", help="Messages stored from this time on (needs --topic): now, epoch ms, ISO 8601 "
                                      "or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("--end", help="With --time or --key: stored before this time.")
@click.option("--topic", help="The topic (optional with --id: else every topic is searched).")
@click.option("--max", "max_results", type=int, default=64, show_default=True, help="At most this many messages.")
@_target_options
def query_msg(target: _Target, as_json: bool, message_id: str | None, key: str | None, begin: str | None,
              end: str | None, topic: str | None, max_results: int) -> None:
    """Look messages up by id, by key, or by store time."""
    if sum(x is not None for x in (message_id, key, begin)) != 1:
        raise click.UsageError("give exactly one of --id, --key or --time")
    begin_ms = _time_option(begin)
    if begin is not None and begin_ms is None:
        raise click.BadParameter("'now' as a begin time finds nothing; give a time in the past", param_hint="--time")
    args = {"id": message_id, "key": key, "topic": topic, "begin_ms": begin_ms, "end_ms": _time_option(end),
            "max": max_results}
    result = target.run("query-msg", {k: v for k, v in args.items() if v is not None})
    if message_id is not None and not result:
        raise click.ClickException(f"no message with id {message_id}" + (f" in topic {topic}" if topic else ""))
    _emit(result, as_json, _render_messages)


@command.command("reset-offset")
@click.argument("group")
@click.argument("topic")
@click.option("--time", "when", required=True,
              help="Where to: now (the end), epoch ms, ISO 8601 or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("--force/--no-force", default=True, show_default=True,
              help="--no-force only moves queues back (a group ahead of the time keeps its place).")
@_target_options
def reset_offset(target: _Target, as_json: bool, group: str, topic: str, when: str, force: bool) -> None:
    """Move GROUP on every queue of TOPIC to the first message stored at --time (RocketMQ's resetOffsetByTime)."""
    timestamp = _time_option(when)

    def render(result: dict[str, Any]) -> None:
        at = "now (the end of each queue)" if result["timestamp_ms"] is None else _when(result["timestamp_ms"])
        table = _table("QID", "Mode", "Previous", "Offset",
                       title=f"group {result['group']} on topic {result['topic']} reset to {at}"
                             f"{'' if result['force'] else ' (only backwards)'}")
        for q in result["queues"]:
            table.add_row(str(q["queue_id"]), q["mode"], "-" if q["previous"] is None else str(q["previous"]),
                          str(q["offset"]))
        _print_table(table)
        if result["moved_members"]:
            click.echo(f"push consumers restarted from the new offsets: {', '.join(result['moved_members'])}")

    args = {"group": group, "topic": topic, "timestamp_ms": timestamp, "force": force}
    _emit(target.run("reset-offset", args), as_json, render)


@command.command("resend-dlq")
@click.argument("group")
@click.option("--id", "ids", multiple=True, help="Only this dead letter (repeat, or comma-separate).")
@click.option("--limit", type=int, default=1000, show_default=True, help="At most this many messages.")
@click.option("--to", "destination", type=click.Choice(["topic", "retry"]), default="topic", show_default=True,
              help="topic: the original topic (every group subscribed to it gets the message); retry: "
                   "%RETRY%<GROUP> (only the group's push consumers that retry read it).")
@_target_options
def resend_dlq(target: _Target, as_json: bool, group: str, ids: Sequence[str], limit: int,
               destination: str) -> None:
    """Send GROUP's dead letters back so it consumes them again (those not resent before, or --id ones)."""
    wanted = [part.strip() for value in ids for part in value.split(",") if part.strip()]

    def render(result: dict[str, Any]) -> None:
        resent = result["resent"]
        click.echo(f"resent {len(resent)} message(s) of {result['dead_letter_topic']} to "
                   f"{'their original topic' if result['target'] == 'topic' else 'the retry topic'}")
        if resent:
            table = _table("DLQ Offset", "Unique Id", "Topic", "QID", "New Msg Id")
            for r in resent:
                table.add_row(str(r["dlq_offset"]), r["unique_id"] or "-", r["topic"], str(r["queue_id"]), r["msg_id"])
            _print_table(table)
        for line in result["skipped"]:
            click.echo(f"skipped {line}")
        if result["remaining"]:
            click.echo(f"{result['remaining']} more dead letter(s) after the limit; run again to resend them")

    args = {"group": group, "ids": wanted, "limit": limit, "target": destination}
    _emit(target.run("resend-dlq", args), as_json, render)


@command.command("trace")
@click.option("--id", "message_id", required=True, help="A client message id (unique key), or an offset message id.")
@_target_options
def trace(target: _Target, as_json: bool, message_id: str) -> None:
    """Every step of a message's path on this broker: stored, delivered, acked, retried, dead-lettered, re-driven.

    Needs the trace plugin in broker.plugins; the stored steps come from the store's copies.
    """
    def render(result: dict[str, Any]) -> None:
        table = _table("Time", "Step", "Topic", "QID", "Offset", "Group", "Client", "Attempt", "Details",
                       title=f"message {result['unique_id']} on broker {result['broker']}")
        for e in result["events"]:
            details = " ".join(f"{k}={v}" for k, v in e["detail"].items())
            table.add_row(_when(e["at_ms"]), e["kind"], e["topic"], str(e["queue_id"]), str(e["queue_offset"]),
                          e["group"] or "-", e["client"] or "-", str(e["attempt"] or "-"), details)
        _print_table(table)

    result = target.run("trace", {"id": message_id})
    if not result["events"]:
        raise click.ClickException(f"no trace of message {message_id} on this broker (not stored here, or "
                                   "stored before the trace plugin was enabled)")
    _emit(result, as_json, render)


@command.command("group-inflight")
@click.argument("group")
@click.option("--limit", type=int, default=1000, show_default=True, help="At most this many messages.")
@_target_options
def group_inflight(target: _Target, as_json: bool, group: str, limit: int) -> None:
    """GROUP's messages received by a pop consumer and not acked yet."""
    def render(rows: list[dict[str, Any]]) -> None:
        table = _table("Topic", "QID", "Offset", "Attempt", "Invisible Until", "Unique Id")
        for m in rows:
            table.add_row(m["topic"], str(m["queue_id"]), str(m["queue_offset"]), str(m["attempt"]),
                          _when(m["invisible_until_ms"]), m["unique_id"] or "-")
        _print_table(table)

    _emit(target.run("group-inflight", {"group": group, "limit": limit}), as_json, render)


@command.command("group-clients")
@click.argument("group")
@_target_options
def group_clients(target: _Target, as_json: bool, group: str) -> None:
    """GROUP's consumers connected to this broker: RocketMQ 5 clients of plugmq serve, in-process push consumers."""
    def render(result: dict[str, Any]) -> None:
        table = _table("Client Id", "Kind", "Access Point", title=f"group {result['group']} on {result['broker']}")
        for c in result["clients"]:
            table.add_row(c["client_id"], c["kind"], c["access_point"] or "-")
        _print_table(table)

    _emit(target.run("group-clients", {"group": group}), as_json, render)


@command.command("dlq-browse")
@click.argument("group")
@click.option("--offset", type=int, help="The first dead-letter queue offset (default: the oldest kept).")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many messages.")
@_target_options
def dlq_browse(target: _Target, as_json: bool, group: str, offset: int | None, limit: int) -> None:
    """A page of GROUP's dead letters (resend-dlq --id sends chosen ones back)."""
    def render(page: dict[str, Any]) -> None:
        table = _table("Offset", "Unique Id", "Original Topic", "Stored", "Reconsume", "Resent", "Body",
                       title=f"{page['dead_letter_topic']} on {page['broker']}: offsets {page['start_offset']}.."
                             f"{page['end_offset']}")
        for d in page["messages"]:
            m = d["message"]
            table.add_row(str(m["queue_offset"]), m["unique_id"] or m["msg_id"], m["properties"].get("RETRY_TOPIC", "-"),
                          _when(m["stored_ms"]), str(m["reconsume_times"]), "yes" if d["resent"] else "",
                          _preview(m["body"], 40))
        _print_table(table)
        if page["next_offset"] < page["end_offset"]:
            click.echo(f"more: --offset {page['next_offset']}")

    args: dict[str, Any] = {"group": group, "limit": limit}
    if offset is not None:
        args["offset"] = offset
    _emit(target.run("dlq-browse", args), as_json, render)


@command.command("cluster-list")
@_target_options
def cluster_list(target: _Target, as_json: bool) -> None:
    """The cluster's live brokers: name, id, role, room, endpoint, epoch, and their topics.

    Give any broker of the cluster: --server (a running one) or --config (its config file; only
    the name service is contacted, so this works beside the running brokers).
    """
    def render(view: dict[str, Any]) -> None:
        state = "" if view["connected"] else " (name service unreachable: last view seen)"
        table = _table("Broker", "ID", "Role", "Room", "Endpoint", "Epoch", "Topics",
                       title=f"cluster {view['cluster']}{state}")
        for b in view["brokers"]:
            topics = ", ".join(f"{name}({t['queues']})" for name, t in b["topics"].items()) or "-"
            table.add_row(b["broker_name"], str(b["broker_id"]), b["role"], b["room"] or "-", b["endpoint"],
                          str(b["epoch"]), topics)
        _print_table(table)
        declared = ", ".join(f"{name}({t['queues']}{', auto' if t['auto_created'] else ''})"
                             for name, t in view["topics"].items())
        click.echo(f"Topics declared for the cluster: {declared or 'none'}")

    _emit(target.run_cluster("cluster-list", {}), as_json, render)


def _replication_rows(table: Any, replication: dict[str, Any]) -> None:
    """Replication figures of broker-status: where it streams from or to, ends, lag per slave."""
    if not replication:
        return
    for key in ("address", "end_offset", "confirmed_offset", "master_end_offset", "connected", "lag_bytes"):
        value = replication.get(key)
        table.add_row(f"replication.{key}", "-" if value is None or value == "" else str(value))
    for slave in replication.get("slaves", []):
        lag_messages = slave.get("lag_messages")
        table.add_row(f"slave {slave['broker_id']}",
                      f"{slave['address']} confirmed {slave['confirmed_offset']}, lag {slave['lag_bytes']} B / "
                      f"{'-' if lag_messages is None else lag_messages} messages"
                      f"{'' if slave.get('in_sync', True) else ' (not in sync)'}")


@command.command("broker-status")
@_target_options
def broker_status(target: _Target, as_json: bool) -> None:
    """The broker at a glance: role, plugins, topics, groups, in-flight and pending work, store figures."""
    def render(status: dict[str, Any]) -> None:
        table = _table("Field", "Value", title=f"broker {status['broker']}")
        for key in ("role", "epoch", "data_dir", "topics", "groups", "pop_inflight", "delay_pending", "transactions_pending",
                    "messages_in", "messages_out"):
            table.add_row(key, "-" if status[key] is None else str(status[key]))
        table.add_row("plugins", ", ".join(status["plugins"]))
        for key, value in sorted(status["store"].items()):
            table.add_row(f"store.{key}", f"{value:g}")
        for key, value in sorted(status["delay"].items()):
            table.add_row(f"delay.{key}", f"{value:g}")
        _replication_rows(table, status.get("replication") or {})
        _print_table(table)

    _emit(target.run("broker-status", {}), as_json, render)


from plugmq.cli import admin_ops  # noqa: E402, F401 - its verbs join this group
