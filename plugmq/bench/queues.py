"""``plugmq bench queues``: many queues on one ``plugmq serve`` under a small open-file limit.

Seed 002 (§7.1) makes "10,000+ queues on one machine" a goal of the commit-log layout. One run
starts a ``plugmq serve`` child whose soft and hard RLIMIT_NOFILE are ``--fd-limit`` (so it cannot
lift them), creates ``--topics`` topics of ``--queues`` queues, sends one message to every queue
through the generated gRPC stub (the server deals a topic's messages round robin over its queues),
receives and acks every one of them, restarts the child (SIGTERM) and does it again: the acked
round must not come back, the new one must arrive on every queue. It reports the child's open
descriptors, its mappings (lines of /proc/PID/maps) and its RSS after each phase.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import click

from plugmq.measure.probes import load_average, status_kib

__all__ = ["Phase", "QueuesRun", "command", "run_queues"]

GROUP = "bench-queues"


@attrs.frozen
class Phase:
    """The serving child after one phase: open descriptors, mappings, resident memory (all of it, and
    the anonymous part: the rest is page cache of mapped store files, which the kernel reclaims),
    seconds taken."""

    name: str
    descriptors: int
    mappings: int
    rss_kb: int
    anon_kb: int
    seconds: float


@attrs.frozen
class QueuesRun:
    topics: int
    queues: int
    fd_limit: int
    phases: tuple[Phase, ...]
    load_average: float

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _child_phase(pid: int, name: str, seconds: float) -> Phase:
    descriptors = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
        mappings = sum(1 for _ in maps)
    return Phase(name, descriptors, mappings, status_kib("VmRSS", pid) or 0, status_kib("RssAnon", pid) or 0,
                 round(seconds, 2))


def write_config(directory: Path, queues: int) -> Path:
    config = directory / "broker.toml"
    config.write_text(f'[broker]\ndata_dir = "data"\ndefault_queue_count = {queues}\nplugins = ["store_mmap"]\n'
                      "[server]\nlong_polling_s = 1\n", encoding="utf-8")
    return config


def send_every_queue(stub: Any, topics: int, queues: int, round_: int) -> None:
    """``queues`` SendMessage calls per topic, one message each: the server puts a call's messages
    on one queue (as RocketMQ's proxy sends a batch) and the next call on the next queue, so each
    queue of the topic gets one."""
    from rocketmq.grpc_protocol import Code, MessageType, service_pb2

    for t in range(topics):
        for q in range(queues):
            request = service_pb2.SendMessageRequest()
            message = request.messages.add(body=f"{round_}:{t}:{q}".encode())
            message.topic.name = f"q{t}"
            message.system_properties.message_id = f"r{round_}-t{t}-{q}"
            message.system_properties.message_type = MessageType.NORMAL
            response = stub.SendMessage(request, timeout=30)
            if response.status.code != Code.OK:
                raise click.ClickException(f"send to topic q{t} failed: {response.status.message}")


def receive_every_queue(stub: Any, topics: int, queues: int, round_: int) -> None:
    """Receive and ack each topic's messages: exactly one of ``round_`` from every queue, none other."""
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import Code, service_pb2

    for t in range(topics):
        request = service_pb2.ReceiveMessageRequest(batch_size=queues * 2, auto_renew=False)
        request.group.name = GROUP
        request.message_queue.topic.name = f"q{t}"
        request.message_queue.id = -1
        request.invisible_duration.CopyFrom(Duration(seconds=60))
        request.long_polling_timeout.CopyFrom(Duration(seconds=1))
        seen: dict[int, str] = {}
        ack = service_pb2.AckMessageRequest()
        ack.group.name = GROUP
        ack.topic.name = f"q{t}"
        for response in stub.ReceiveMessage(request, timeout=30):
            kind = response.WhichOneof("content")
            if kind == "status" and response.status.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
                raise click.ClickException(f"receive from topic q{t} failed: {response.status.message}")
            if kind == "message":
                props = response.message.system_properties
                seen[props.queue_id] = response.message.body.decode()
                ack.entries.add(message_id=props.message_id, receipt_handle=props.receipt_handle)
        want = {q: f"{round_}:{t}:{q}" for q in range(queues)}
        if sorted(seen.values()) != sorted(want.values()) or set(seen) != set(want):
            raise click.ClickException(f"topic q{t}: received {sorted(seen.values())}, expected one message of "
                                       f"round {round_} on each of its {queues} queues")
        if stub.AckMessage(ack, timeout=30).status.code != Code.OK:
            raise click.ClickException(f"ack on topic q{t} failed")


@contextmanager
def _serving(config: Path, fd_limit: int) -> Iterator[tuple[Any, Any]]:
    import grpc
    from rocketmq.grpc_protocol import MessagingServiceStub

    from plugmq.testing import ServeProcess

    child = ServeProcess(config, fd_limit=fd_limit)
    try:
        address = child.await_address()
        with grpc.insecure_channel(address) as channel:
            yield child, MessagingServiceStub(channel)
    finally:
        stopping = time.perf_counter()
        code = child.stop(timeout_s=600)
        tail = "\n".join(child.log_path.read_text(errors="replace").splitlines()[-15:])
        if code not in (0, None):
            raise click.ClickException(f"plugmq serve exited with {code} after SIGTERM "
                                       f"({time.perf_counter() - stopping:.0f} s); its log ends:\n{tail}")


def run_queues(workdir: Path, topics: int, queues: int, fd_limit: int) -> QueuesRun:
    """Send and receive on every one of ``topics`` x ``queues`` queues, restart, and again."""
    config = write_config(workdir, queues)
    phases: list[Phase] = []
    for round_ in (1, 2):
        began = time.perf_counter()
        with _serving(config, fd_limit) as (child, stub):
            pid = child.process.pid
            phases.append(_child_phase(pid, f"start {round_}", time.perf_counter() - began))
            began = time.perf_counter()
            send_every_queue(stub, topics, queues, round_)
            phases.append(_child_phase(pid, f"send {round_}", time.perf_counter() - began))
            began = time.perf_counter()
            receive_every_queue(stub, topics, queues, round_)
            phases.append(_child_phase(pid, f"receive {round_}", time.perf_counter() - began))
    return QueuesRun(topics, queues, fd_limit, tuple(phases), load_average()[0])


@click.command("queues")
@click.option("--topics", default=1250, show_default=True, help="topics to create")
@click.option("--queues", default=8, show_default=True, help="queues per topic")
@click.option("--fd-limit", default=1024, show_default=True, help="the server's soft and hard RLIMIT_NOFILE")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(topics: int, queues: int, fd_limit: int, as_json: bool) -> None:
    """Serve TOPICS x QUEUES queues under an open-file limit: send and receive on each, restart, again."""
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-queues-") as tmp:
        run = run_queues(Path(tmp), topics, queues, fd_limit)
    if as_json:
        click.echo(json.dumps(run.as_dict(), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{topics} topics x {queues} queues = {topics * queues} queues, RLIMIT_NOFILE {fd_limit} "
                        f"(load average {run.load_average:.2f})")
    for column in ("phase", "seconds", "open fds", "mappings", "RSS MiB", "anonymous MiB"):
        table.add_column(column, justify="right" if column != "phase" else "left")
    for phase in run.phases:
        table.add_row(phase.name, f"{phase.seconds:.1f}", str(phase.descriptors), str(phase.mappings),
                      f"{phase.rss_kb / 1024:.0f}", f"{phase.anon_kb / 1024:.0f}")
    Console().print(table)
