"""``plugmq demo``: assemble the default broker and exercise every installed family, telling the story.

The broker runs on a virtual clock. A data dir keeps the demo's earlier runs: each run uses its own
topic and group names (suffix ``-r<n>`` from the second run on) and starts its clock after the last
run's, so a reused directory tells the same story; a directory holding anything but a demo broker
is refused.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs
import click
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.broker.topics import write_json_atomically
from plugmq.cli.layout import print_table
from plugmq.config.broker import DEFAULT_PLUGINS
from plugmq.core.clock import ManualClock
from plugmq.core.contracts import Family, TransactionDecision
from plugmq.core.errors import PlugmqError
from plugmq.core.message import Message, PullStatus, StoredMessage
from plugmq.core.modes import ConsumeFrom, ConsumeStatus, OrderlyStatus
from plugmq.core.pluginmanager import installed_plugins

__all__ = ["DemoDirError", "demo", "run_demo"]

_MARKER = "plugmq-demo.json"
_START = 1_700_000_000.0
_BETWEEN_RUNS_S = 3600.0
_DLQ_ATTEMPTS = 3


class DemoDirError(PlugmqError):
    """The --data-dir holds something that is not a plugmq demo broker."""


@attrs.frozen
class _Run:
    number: int
    clock_start: float

    def name(self, base: str) -> str:
        return base if self.number == 1 else f"{base}-r{self.number}"


def _previous_run(data_dir: Path) -> _Run:
    """This run's number and clock start, from the marker the last run left (refusing foreign dirs)."""
    marker = data_dir / _MARKER
    if marker.exists():
        try:
            last = json.loads(marker.read_text(encoding="utf-8"))
            return _Run(int(last["runs"]) + 1, float(last["clock"]) + _BETWEEN_RUNS_S)
        except (ValueError, KeyError, TypeError) as exc:
            raise DemoDirError(f"{marker} is unreadable ({exc}); delete {data_dir} or pick another --data-dir") from None
    if data_dir.exists() and any(data_dir.iterdir()):
        raise DemoDirError(f"--data-dir {data_dir} is not empty and holds no plugmq demo ({_MARKER} is missing); "
                           "the demo writes topics and messages there: give an empty or new directory")
    return _Run(1, _START)


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
    run = _previous_run(data_dir)
    console.rule("[bold]plugmq demo")
    plugins = _installed_defaults(console)
    clock = ManualClock(start=run.clock_start)
    orders, shipments, payments, jobs = (run.name(t) for t in ("DemoOrders", "DemoShipments", "DemoPayments",
                                                                 "DemoJobs"))
    workers, poison = run.name("demo-workers"), run.name("demo-poison")
    groups = {poison: {"max_delivery_attempts": _DLQ_ATTEMPTS, "backoff_s": [10, 30]}}
    broker = Broker.open(data_dir, plugins=plugins, clock=clock, groups=groups)
    with broker:
        if run.number > 1:
            console.print(f"run {run.number} on {data_dir}: topics and groups get the suffix -r{run.number}; "
                          "the earlier runs' messages are still in the store")
        table = Table(title=f"broker {broker.name!r} in {data_dir} (virtual clock)")
        table.add_column("plugin", no_wrap=True)
        table.add_column("families")
        for name, decl in broker.plugins.declarations.items():
            table.add_row(name, ", ".join(sorted(f.value for f in decl.families)))
        print_table(table, console)
        queues = broker.create_topic(orders, 4)
        sent = []

        def storage() -> None:
            for i in range(8):
                message = Message(orders, f"order {i}".encode(), tags="paid" if i % 2 else "created",
                                  keys=f"order-{i}", properties={"amount": str(i * 20), "region": "eu" if i < 4 else "us"})
                sent.append(broker.put(message, queue_id=i % 4))
            console.print(f"sent 8 messages to {orders!r} over 4 queues; first msg_id={sent[0].msg_id}")
            result = broker.pull(queues[0], 0, 32)
            console.print(f"pull queue 0 from offset 0 -> {result.status.value}: "
                          f"{[m.body.decode() for m in result.messages]} next={result.next_begin_offset}")
            by_key = broker.query_by_key(orders, "order-5")
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
            delayed = broker.put(Message(orders, b"reminder", tags="remind",
                                         deliver_at_ms=clock.now_ms() + 10_000), queue_id=1)
            before = broker.max_offset(queues[1])
            console.print(f"scheduled 'reminder' for +10 s (msg_id {delayed.msg_id}); queue 1 max offset {before}")
            clock.advance(9)
            console.print(f"after 9 virtual seconds: queue 1 max offset {broker.max_offset(queues[1])} (not yet due)")
            clock.advance(2)
            after = broker.pull(queues[1], before, 8)
            console.print(f"after 11 virtual seconds: {[m.body.decode() for m in after.messages]} delivered")
            if broker.delay.capabilities.cancel:
                cancelled = broker.put(Message(orders, b"cancelled", deliver_at_ms=clock.now_ms() + 5_000), queue_id=1)
                console.print(f"cancel of a pending delayed message -> {broker.cancel_delayed(cancelled.msg_id)}")
                mark = broker.max_offset(queues[1])
                clock.advance(10)
                console.print(f"after its due time queue 1 grew by {broker.max_offset(queues[1]) - mark} (0: never delivered)")

        def messaging() -> None:
            broker.create_topic(shipments, 4)
            ordered: dict[str, list[str]] = {}

            def ordered_listener(messages: list[StoredMessage]) -> OrderlyStatus:
                for m in messages:
                    ordered.setdefault(m.properties["order"], []).append(m.body.decode())
                return OrderlyStatus.SUCCESS

            orderly = broker.push_consumer(run.name("demo-orderly"), ordered_listener, orderly=True, background=False,
                                           consume_from=ConsumeFrom.FIRST_OFFSET).subscribe(shipments).start()
            with broker.producer("demo-producer") as producer:
                for step in ("created", "paid", "packed", "shipped"):
                    for order in ("A", "B", "C"):
                        producer.send(Message(shipments, step.encode(), properties={"order": order}),
                                      selector=lambda qs, m, arg: qs[ord(arg) % len(qs)], arg=order)
            orderly.consume_available()
            orderly.shutdown()
            console.print(f"ordered (selector by order id, orderly listener): {ordered}")
            if broker.delay is None:
                console.print("[yellow]retry needs a delay plugin: skipped[/yellow]")
                return
            attempts: list[str] = []
            start = clock.now()

            def flaky(messages: list[StoredMessage]) -> ConsumeStatus:
                for m in messages:
                    attempts.append(f"{m.body.decode()}#{m.reconsume_times}@+{clock.now() - start:.0f}s")
                    if m.reconsume_times < 2:
                        return ConsumeStatus.RECONSUME_LATER
                return ConsumeStatus.CONSUME_SUCCESS

            retrying = broker.push_consumer(run.name("demo-retry"), flaky, background=False,
                                            consume_from=ConsumeFrom.LAST_OFFSET).subscribe(shipments).start()
            broker.put(Message(shipments, b"flaky-order"), 0)
            for _ in range(60):
                retrying.consume_available()
                clock.advance(1)
            retrying.shutdown()
            console.print(f"retried (fails twice; back-off delay levels 3 and 4 = 10 s then 30 s): {attempts}")

        def simple_consumer() -> None:
            broker.create_topic(jobs, 2)
            with broker.producer("demo-jobs") as producer:
                for name in ("resize", "encode", "upload"):
                    producer.send(Message(jobs, name.encode(), tags="job"))
            consumer = broker.simple_consumer(workers, {jobs: "job"})
            got = consumer.receive(16, invisible_duration_s=30)
            console.print(f"receive -> {[(m.body.decode(), m.delivery_attempt) for m in got]} (invisible for 30 s)")
            by_body = {m.body: m for m in got}
            consumer.ack(by_body[b"resize"])
            slow = consumer.change_invisible_duration(by_body[b"upload"], 120)
            console.print("acked 'resize'; 'upload' needs longer: its invisible duration is now 120 s; "
                          "'encode' is left unacked")
            clock.advance(31)
            again = consumer.receive(16, invisible_duration_s=30)
            console.print(f"31 s later -> {[(m.body.decode(), m.delivery_attempt) for m in again]} "
                          "(the unacked one, attempt 2)")
            for message in (*again, slow):
                consumer.ack(message)
            clock.advance(600)
            console.print(f"all acked; 10 min later -> {consumer.receive(16, invisible_duration_s=30)}")

        def dead_letter() -> None:
            broker.create_topic(run.name("DemoPoison"), 1)
            broker.put(Message(run.name("DemoPoison"), b"poison-pill"), 0)
            consumer = broker.simple_consumer(poison, {run.name("DemoPoison"): "*"})
            policy = broker.group_policy(poison).redelivery
            console.print(f"group {poison!r}: max_delivery_attempts={policy.max_attempts}, "
                          f"backoff_s={list(policy.backoff_s)}, dead-letter topic "
                          f"{policy.dead_letter_topic_for(poison)!r}")
            for _ in range(_DLQ_ATTEMPTS):
                (message,) = consumer.receive(1, invisible_duration_s=5)
                nacked = consumer.nack(message)  # give up: back after the policy's back-off for this attempt
                console.print(f"attempt {message.delivery_attempt} failed at +{clock.now() - clock_zero:.0f}s; "
                              f"nacked -> back no sooner than {policy.backoff_ms(message.delivery_attempt) // 1000} s")
                clock.advance(policy.backoff_ms(nacked.delivery_attempt) / 1000)
            dlq = broker.topic_queues(policy.dead_letter_topic_for(poison))[0]
            dead = broker.pull(dlq, 0, 8).messages
            console.print(f"{dlq.topic!r} now holds {[(m.body.decode(), m.reconsume_times) for m in dead]} "
                          "(reconsume times = attempts - 1); the group receives nothing more: "
                          f"{consumer.receive(1, invisible_duration_s=5)}")

        def transactions() -> None:
            queue = broker.create_topic(payments, 1)[0]
            outcomes = {"pay-1": TransactionDecision.COMMIT, "pay-2": TransactionDecision.ROLLBACK,
                        "pay-3": TransactionDecision.UNKNOWN}
            checked: list[str] = []

            def local_transaction(message: Message, arg: object) -> TransactionDecision:
                return outcomes[message.body.decode()]

            def check_listener(message: StoredMessage) -> TransactionDecision:
                checked.append(message.body.decode())
                return TransactionDecision.COMMIT

            producer = broker.transaction_producer(run.name("demo-tx"), local_transaction, check_listener)
            for body in outcomes:
                result = producer.send_in_transaction(Message(payments, body.encode()))
                console.print(f"{body}: local transaction said {result.local_decision.name}")
            visible = [m.body.decode() for m in broker.pull(queue, 0, 8).messages]
            console.print(f"visible on {payments!r} right away: {visible}")
            assert broker.transactions is not None
            clock.advance(broker.transactions.capabilities.transaction_timeout_ms / 1000 + 1)
            visible = [m.body.decode() for m in broker.pull(queue, 0, 8).messages]
            console.print(f"after the transaction timeout the broker checked back {checked} -> visible: {visible}")
            producer.close()

        clock_zero = clock.now()
        _step(console, "storage", Family.STORAGE, broker, storage)
        _step(console, "filters", Family.FILTER, broker, filters)
        _step(console, "allocation", Family.ALLOCATION, broker, allocation)
        _step(console, "delay", Family.DELAY, broker, delay)
        _step(console, "messaging: ordered and retried", Family.ALLOCATION, broker, messaging)
        _step(console, "simple consumer: receive, ack, invisible time", Family.STORAGE, broker, simple_consumer)
        clock_zero = clock.now()
        _step(console, "dead letters: a message nobody can consume", Family.STORAGE, broker, dead_letter)
        _step(console, "transactions", Family.TRANSACTION, broker, transactions)
        write_json_atomically(data_dir / _MARKER, {"runs": run.number, "clock": clock.now()})
    console.rule("[bold green]demo finished")
    return broker


@click.command("demo")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the demo broker keeps its files (default: a fresh temporary directory). "
                   "Reusing it runs the story again beside the earlier runs.")
def demo(data_dir: Path | None) -> None:
    """Assemble the default broker and exercise every installed plugin family."""
    console = Console()
    if data_dir is not None:
        try:
            run_demo(data_dir, console)
        except DemoDirError as exc:
            raise click.ClickException(str(exc)) from None
        return
    with tempfile.TemporaryDirectory(prefix="plugmq-demo-") as tmp:
        run_demo(Path(tmp), console)
