"""``plugmq allocate``: who gets which queue under a strategy, before rolling it out."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from plugmq.broker.allocation_api import unknown_strategy_error
from plugmq.cli.layout import print_table
from plugmq.core.errors import AllocationError
from plugmq.core.message import MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["command", "format_queues", "parse_params", "parse_queues"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_queues(spec: str) -> list[MessageQueue]:
    """``T:broker-a:0-7,broker-b:0-3,U:broker-a:0`` -> queues; an item without a topic reuses
    the previous item's topic. Ranges are inclusive."""
    result: list[MessageQueue] = []
    topic: str | None = None
    for item in spec.split(","):
        item = item.strip()
        parts = item.split(":")
        if len(parts) == 3:
            topic, broker, ids = parts
        elif len(parts) == 2 and topic is not None:
            broker, ids = parts
        elif len(parts) == 2:
            raise ValueError(f"{item!r} has no topic: the first item must be TOPIC:BROKER:IDS")
        else:
            raise ValueError(f"{item!r} is not TOPIC:BROKER:IDS or BROKER:IDS (e.g. T:broker-a:0-7)")
        if not topic or not broker:
            raise ValueError(f"{item!r} has an empty topic or broker name")
        match = _RANGE.match(ids.strip())
        if match is None:
            raise ValueError(f"{item!r}: queue ids must be N or N-M (inclusive), got {ids!r}")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last < first:
            raise ValueError(f"{item!r}: the range {ids!r} is empty (N-M needs N <= M)")
        result += [MessageQueue(topic, broker, i) for i in range(first, last + 1)]
    return result


def _parse_value(name: str, raw: str) -> Any:
    if re.fullmatch(r"[+-]?\d+", raw):
        return int(raw)
    if raw[:1] in "[{":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: the value looks like JSON but does not parse: {exc}") from exc
    if name == "message_queues":
        return parse_queues(raw)  # same syntax as --queues
    return raw


def parse_params(items: Iterable[str]) -> dict[str, Any]:
    """``k=v`` pairs: ints become ints, ``[...]``/``{...}`` are JSON, the rest strings."""
    params: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{item!r} is not NAME=VALUE")
        if name in params:
            raise ValueError(f"{name!r} given twice")
        params[name] = _parse_value(name, raw.strip())
    return params


def format_queues(queues: list[MessageQueue]) -> str:
    """Consecutive ids of one topic and broker collapse into a range: ``T:broker-a:0-3``."""
    runs: list[list[Any]] = []
    for q in queues:
        last = runs[-1] if runs else None
        if last and last[0] == q.topic and last[1] == q.broker_name and last[3] + 1 == q.queue_id:
            last[3] = q.queue_id
        else:
            runs.append([q.topic, q.broker_name, q.queue_id, q.queue_id])
    return ", ".join(f"{t}:{b}:{a}" if a == z else f"{t}:{b}:{a}-{z}" for t, b, a, z in runs)


def _queue_json(q: MessageQueue) -> dict[str, Any]:
    return {"topic": q.topic, "broker_name": q.broker_name, "queue_id": q.queue_id}


def _split_ids(spec: str) -> list[str]:
    ids = [c.strip() for c in spec.split(",")]
    if any(not c for c in ids):
        raise ValueError(f"{spec!r} has an empty consumer id (ids are comma-separated)")
    return ids


@click.command("allocate")
@click.option("--strategy", "-s", required=True, help="Strategy name, e.g. AVG, CONSISTENT_HASH.")
@click.option("--queues", "-q", "queue_specs", required=True, multiple=True,
              help="Queues as TOPIC:BROKER:IDS[,BROKER:IDS...], IDS = N or N-M; repeatable.")
@click.option("--consumers", "-c", required=True, help="Comma-separated consumer (client) ids.")
@click.option("--param", "-p", "param_items", multiple=True,
              help="Strategy parameter NAME=VALUE (ints and JSON lists/dicts are parsed); repeatable.")
@click.option("--group", "consumer_group", default="", help="Consumer group name passed to the strategy.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(strategy: str, queue_specs: tuple[str, ...], consumers: str, param_items: tuple[str, ...],
            consumer_group: str, as_json: bool) -> None:
    """Show every consumer's queues under a strategy, inputs sorted as RocketMQ's rebalance sorts them."""
    queues, ids, params = _arguments(queue_specs, consumers, param_items)

    # Imported here: loading every installed plugin is not needed to parse the arguments.
    from plugmq.core.pluginmanager import installed_allocate_strategies

    strategies = installed_allocate_strategies()
    sorted_queues, sorted_ids = rocketmq_sorted(queues, ids)
    try:
        factory = strategies.get(strategy)
        if factory is None:
            raise unknown_strategy_error(strategy, strategies)
        chosen = factory(**params)
        assignment = {
            cid: chosen.allocate(consumer_group, cid, sorted_queues, sorted_ids) for cid in dict.fromkeys(sorted_ids)
        }
    except AllocationError as exc:
        raise click.ClickException(str(exc)) from exc

    assigned = {q for share in assignment.values() for q in share}
    unassigned = [q for q in sorted_queues if q not in assigned]
    if as_json:
        click.echo(json.dumps({
            "strategy": strategy,
            "consumer_group": consumer_group,
            "queues": [_queue_json(q) for q in sorted_queues],
            "consumers": sorted_ids,
            "assignment": {cid: [_queue_json(q) for q in share] for cid, share in assignment.items()},
            "unassigned": [_queue_json(q) for q in unassigned],
        }, indent=2))
        return
    _print_table(f"{strategy}: {len(sorted_queues)} queues, {len(sorted_ids)} consumers", assignment, unassigned)


def _arguments(queue_specs: tuple[str, ...], consumers: str, param_items: tuple[str, ...]
               ) -> tuple[list[MessageQueue], list[str], dict[str, Any]]:
    """The queues, consumer ids and strategy parameters, each error naming its option."""
    try:
        queues = [q for spec in queue_specs for q in parse_queues(spec)]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--queues") from exc
    try:
        ids = _split_ids(consumers)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--consumers") from exc
    try:
        params = parse_params(param_items)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--param") from exc
    return queues, ids, params


def _print_table(title: str, assignment: dict[str, list[MessageQueue]], unassigned: list[MessageQueue]) -> None:
    # Text cells: broker names like "b:x:" must not turn into emoji or markup.
    table = Table(title=title)
    table.add_column("consumer", no_wrap=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("queues")
    for cid, share in assignment.items():
        table.add_row(Text(cid), str(len(share)), Text(format_queues(share) or "-"))
    if unassigned:
        table.add_row("(unassigned)", str(len(unassigned)), Text(format_queues(unassigned)), style="yellow")
    console = Console()
    print_table(table, console)
    console.print("inputs sorted as RocketMQ's rebalance sorts them", style="dim")
