"""``plugmq demo``: assemble the default broker and exercise every installed family, telling the story."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from plugmq.core.broker import Broker
from plugmq.core.clock import ManualClock
from plugmq.core.config import DEFAULT_PLUGINS
from plugmq.core.contracts import Family
from plugmq.core.errors import PlugmqError
from plugmq.core.message import Message, PullStatus
from plugmq.core.pluginmanager import installed_plugins

TOPIC = "DemoOrders"


def _installed_defaults(console: Console) -> list[str]:
    usable = {p.name: p for p in installed_plugins()}
    chosen = []
    for name in DEFAULT_PLUGINS:
        plugin = usable.get(name)
        if plugin is not None and plugin.error is None:
            chosen.append(name)
        else:
            console.print(f"  [yellow]default plugin {name!r} is not installed[/yellow]")
    return chosen


def _step(console: Console, title: str, family: Family, broker: Broker, body: Callable[[], None]) -> None:
    console.rule(f"[bold]{title}")
    names = broker.plugins.with_family(family)
    if not names:
        console.print(f"[yellow]{family.value}: not installed in this broker[/yellow]")
        return
    console.print(f"plugin(s): {', '.join(names)}")
    try:
        body()
    except PlugmqError as exc:
        console.print(f"[red]{family.value} step failed: {exc}[/red]")
        raise


def run_demo(data_dir: Path, console: Console) -> Broker:
    """Run the demo story against a broker in ``data_dir``; returns the (closed) broker."""
    console.rule("[bold]plugmq demo")
    plugins = _installed_defaults(console)
    clock = ManualClock()
    broker = Broker.open(data_dir, plugins=plugins, clock=clock)
    with broker:
        table = Table(title=f"broker {broker.name!r} in {data_dir} (virtual clock)")
        table.add_column("plugin")
        table.add_column("families")
        for name, decl in broker.plugins.declarations.items():
            table.add_row(name, ", ".join(sorted(f.value for f in decl.families)))
        console.print(table)
        queues = broker.create_topic(TOPIC, 4)
        sent = []

        def storage() -> None:
            for i in range(8):
                message = Message(TOPIC, f"order {i}".encode(), tags="paid" if i % 2 else "created",
                                  keys=f"order-{i}", properties={"amount": str(i * 20), "region": "eu" if i < 4 else "us"})
                sent.append(broker.put(message, queue_id=i % 4))
            console.print(f"sent 8 messages to {TOPIC!r} over 4 queues; first msg_id={sent[0].msg_id}")
            result = broker.pull(queues[0], 0, 32)
            console.print(f"pull queue 0 from offset 0 -> {result.status.value}: "
                          f"{[m.body.decode() for m in result.messages]} next={result.next_begin_offset}")
            by_key = broker.query_by_key(TOPIC, "order-5")
            console.print(f"query by key 'order-5' -> {[m.body.decode() for m in by_key]}")
            by_id = broker.query_by_id(sent[3].msg_id)
            console.print(f"query by id {sent[3].msg_id} -> {by_id.body.decode() if by_id else None}")

        def filters() -> None:
            for expression_type, expression in (("TAG", "paid"), ("SQL92", "amount > 50 AND region = 'us'")):
                if expression_type not in broker.filters:
                    console.print(f"[yellow]{expression_type} filter: not installed[/yellow]")
                    continue
                subscription = broker.compile_subscription(expression_type, expression)
                bodies = []
                for queue in queues:
                    result = broker.pull(queue, 0, 32, subscription)
                    if result.status is PullStatus.FOUND:
                        bodies += [m.body.decode() for m in result.messages]
                console.print(f"{expression_type} {expression!r} -> {sorted(bodies)}")

        def allocation() -> None:
            consumers = ["consumer-1", "consumer-2", "consumer-3"]
            for strategy in ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"):
                if strategy not in broker.strategies:
                    continue
                chosen = broker.strategies[strategy]()
                parts = [f"{c}: {[q.queue_id for q in chosen.allocate('demo-group', c, queues, consumers)]}"
                         for c in consumers]
                console.print(f"{strategy:<16} " + "  ".join(parts))

        def delay() -> None:
            assert broker.delay is not None
            delayed = broker.put(Message(TOPIC, b"reminder", tags="remind",
                                         deliver_at_ms=clock.now_ms() + 10_000), queue_id=1)
            before = broker.max_offset(queues[1])
            console.print(f"scheduled 'reminder' for +10 s (msg_id {delayed.msg_id}); queue 1 max offset {before}")
            clock.advance(9)
            console.print(f"after 9 virtual seconds: queue 1 max offset {broker.max_offset(queues[1])} (not yet due)")
            clock.advance(2)
            after = broker.pull(queues[1], before, 8)
            console.print(f"after 11 virtual seconds: {[m.body.decode() for m in after.messages]} delivered")
            if broker.delay.capabilities.cancel:
                cancelled = broker.put(Message(TOPIC, b"cancelled", deliver_at_ms=clock.now_ms() + 5_000), queue_id=1)
                console.print(f"cancel of a pending delayed message -> {broker.cancel_delayed(cancelled.msg_id)}")
                mark = broker.max_offset(queues[1])
                clock.advance(10)
                console.print(f"after its due time queue 1 grew by {broker.max_offset(queues[1]) - mark} (0: never delivered)")

        def messaging() -> None:
            from plugmq.core.consumer import ConsumeFrom, ConsumeStatus, OrderlyStatus

            topic = "DemoShipments"
            broker.create_topic(topic, 4)
            ordered: dict[str, list[str]] = {}

            def ordered_listener(messages: list) -> OrderlyStatus:
                for m in messages:
                    ordered.setdefault(m.properties["order"], []).append(m.body.decode())
                return OrderlyStatus.SUCCESS

            orderly = broker.push_consumer("demo-orderly", ordered_listener, orderly=True, background=False,
                                           consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(topic).start()
            with broker.producer("demo-producer") as producer:
                for step in ("created", "paid", "packed", "shipped"):
                    for order in ("A", "B", "C"):
                        producer.send(Message(topic, step.encode(), properties={"order": order}),
                                      selector=lambda qs, m, arg: qs[ord(arg) % len(qs)], arg=order)
            orderly.consume_available()
            console.print(f"ordered (selector by order id, orderly listener): {ordered}")
            if broker.delay is None:
                console.print("[yellow]retry needs a delay plugin: skipped[/yellow]")
                return
            attempts: list[str] = []

            def flaky(messages: list) -> ConsumeStatus:
                for m in messages:
                    attempts.append(f"{m.body.decode()}#{m.reconsume_times}@+{clock.now() - start:.0f}s")
                    if m.reconsume_times < 2:
                        return ConsumeStatus.RECONSUME_LATER
                return ConsumeStatus.CONSUME_SUCCESS

            retrying = broker.push_consumer("demo-retry", flaky, background=False,
                                            consume_from=ConsumeFrom.LAST_OFFSET).subscribe(topic).start()
            start = clock.now()
            broker.put(Message(topic, b"flaky-order"), 0)
            for _ in range(60):
                retrying.consume_available()
                clock.advance(1)
            console.print(f"retried (fails twice; back-off delay levels 3 and 4 = 10 s then 30 s): {attempts}")

        def transactions() -> None:
            from plugmq.core.contracts import TransactionDecision

            topic = "DemoPayments"
            queue = broker.create_topic(topic, 1)[0]
            outcomes = {"pay-1": TransactionDecision.COMMIT, "pay-2": TransactionDecision.ROLLBACK,
                        "pay-3": TransactionDecision.UNKNOWN}
            checked: list[str] = []

            def local_transaction(message: Message, arg: object) -> TransactionDecision:
                return outcomes[message.body.decode()]

            def check_listener(message: object) -> TransactionDecision:
                checked.append(message.body.decode())  # type: ignore[attr-defined]
                return TransactionDecision.COMMIT

            producer = broker.transaction_producer("demo-tx", local_transaction, check_listener)
            for body in outcomes:
                result = producer.send_in_transaction(Message(topic, body.encode()))
                console.print(f"{body}: local transaction said {result.local_decision.name}")
            visible = [m.body.decode() for m in broker.pull(queue, 0, 8).messages]
            console.print(f"visible on {topic!r} right away: {visible}")
            clock.advance(broker.transactions.capabilities.transaction_timeout_ms / 1000 + 1)  # type: ignore[union-attr]
            visible = [m.body.decode() for m in broker.pull(queue, 0, 8).messages]
            console.print(f"after the transaction timeout the broker checked back {checked} -> visible: {visible}")
            producer.close()

        _step(console, "storage", Family.STORAGE, broker, storage)
        _step(console, "filters", Family.FILTER, broker, filters)
        _step(console, "allocation", Family.ALLOCATION, broker, allocation)
        _step(console, "delay", Family.DELAY, broker, delay)
        _step(console, "messaging: ordered and retried", Family.ALLOCATION, broker, messaging)
        _step(console, "transactions", Family.TRANSACTION, broker, transactions)
    console.rule("[bold green]demo finished")
    return broker


@click.command("demo")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Where the demo broker keeps its files (default: a fresh temporary directory).")
def demo(data_dir: Path | None) -> None:
    """Assemble the default broker and exercise every installed plugin family."""
    console = Console()
    if data_dir is not None:
        run_demo(data_dir, console)
        return
    with tempfile.TemporaryDirectory(prefix="plugmq-demo-") as tmp:
        run_demo(Path(tmp), console)
