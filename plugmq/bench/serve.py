"""``plugmq bench serve``: what serving a SendMessage costs, against an empty gRPC server.

The baseline is a no-op ``grpc.aio`` server built from the same generated code: its SendMessage
answers OK for every message and stores nothing. One run starts it and ``plugmq serve`` children
(store_mmap, ``flush = "async"``: page cache, no fsync) with ``[server] workers`` 1 and 2, and,
with ``--baseline-python``, a ``plugmq serve`` of another checkout (one process, no workers key).
The same load generator (8 threads in this process, one channel each, generated stubs, 1 and 8
messages per request) drives each server in turn; rounds rotate the order. Per server and request
size it keeps the best rate and the lowest CPU per request of the server (its process and its
children: the front-ends), and prints both as ratios to the no-op server's (``--workers`` picks the
worker counts, ``--baseline-python`` may be given for several checkouts); with front-ends also
the CPU of the process that owns the store alone (one writer: what bounds the served rate however
many front-ends a machine can run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.bench.grpc import ServeChild, _config, _stub_send
from plugmq.measure.probes import LoadWindow, process_cpu_s

__all__ = ["command", "measure", "tree_cpu_s"]

_THREADS = 8
_NOOP_NAME = "no-op grpc.aio server (baseline)"
_NOOP = r"""
import asyncio
import grpc
from plugmq.server.protocol import Code, service_pb2, service_pb2_grpc

class Noop(service_pb2_grpc.MessagingServiceServicer):
    async def SendMessage(self, request, context):
        response = service_pb2.SendMessageResponse()
        response.status.code = Code.OK
        for message in request.messages:
            entry = response.entries.add(message_id=message.system_properties.message_id)
            entry.status.code = Code.OK
        return response

async def main():
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Noop(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (from /proc)."""
    total = process_cpu_s(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                total += tree_cpu_s(int(child))
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
    return total


class _Noop:
    """The no-op server as a child process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _NOOP], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.process.kill()
            raise click.ClickException(f"the no-op server did not start (exit {self.process.wait()})")
        self.address = line.split()[2]
        self.pid = self.process.pid

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _servers(root: Path, baselines: tuple[str, ...], worker_counts: tuple[int, ...]) -> dict[str, Any]:
    servers: dict[str, Any] = {_NOOP_NAME: _Noop()}
    try:
        for workers in worker_counts:
            (root / f"w{workers}").mkdir()
            config = _config(root / f"w{workers}", "store_mmap", "async")
            config.write_text(config.read_text(encoding="utf-8") + f"workers = {workers}\n", encoding="utf-8")
            servers[f"plugmq serve, workers = {workers}"] = ServeChild(config, config.with_name("serve.log"))
        for index, python in enumerate(baselines):
            (root / f"baseline{index}").mkdir()
            config = _config(root / f"baseline{index}", "store_mmap", "async")
            servers[f"plugmq serve (baseline: {python})"] = ServeChild(config, config.with_name("serve.log"),
                                                                       python=python)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def measure(messages: int, body_size: int, rounds: int, baselines: tuple[str, ...] = (),
            worker_counts: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    body = os.urandom(body_size)
    load = LoadWindow()
    best: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-serve-") as tmp:
        servers = _servers(Path(tmp), baselines, worker_counts)
        try:
            names = list(servers)
            for name in names:
                _stub_send(servers[name].address, 64, _THREADS, body, prefix="warm")  # channels, topic creation
            for round_index in range(rounds):
                for name in names[round_index % len(names):] + names[:round_index % len(names)]:
                    pid = servers[name].pid
                    for per_request in (1, 8):
                        began, owner_began = tree_cpu_s(pid), process_cpu_s(pid)
                        rate = _stub_send(servers[name].address, messages, _THREADS, body, per_request,
                                          prefix=f"r{round_index}")
                        requests = messages // _THREADS // per_request * _THREADS
                        owner_ms = (process_cpu_s(pid) - owner_began) * 1000 / requests  # read inside the tree's
                        cpu_ms = (tree_cpu_s(pid) - began) * 1000 / requests  # window: never more than it
                        kept = best.setdefault(name, {}).setdefault(
                            per_request, {"messages_s": 0.0, "cpu_ms": 1e9, "owner_cpu_ms": 1e9})
                        kept["messages_s"] = max(kept["messages_s"], rate)
                        kept["cpu_ms"] = min(kept["cpu_ms"], cpu_ms)
                        kept["owner_cpu_ms"] = min(kept["owner_cpu_ms"], owner_ms)
        finally:
            for server in servers.values():
                server.stop()
    windows = load.finish().as_dict()
    return {"settings": {"messages": messages, "body_size": body_size, "rounds": rounds, "threads": _THREADS,
                         "store": "store_mmap, flush async (page cache, no fsync)", "baseline_python": list(baselines),
                         "load_before": windows["before"], "load_after": windows["after"], "cpus": os.cpu_count()},
            "servers": best}


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline > 0 else "-"  # CPU is counted in clock ticks (10 ms)


def _print(report: dict[str, Any], console: Console) -> None:
    servers = report["servers"]
    noop = servers[_NOOP_NAME]
    table = Table(title=f"SendMessage served ({report['settings']['threads']} stub threads, "
                        f"{report['settings']['body_size']} B bodies, {report['settings']['store']})")
    for column in ("server", "msgs/request", "messages/s", "rate / no-op", "server CPU ms/request",
                   "CPU / no-op", "CPU per extra message (us)", "store process CPU ms/request"):
        table.add_column(column, justify="left" if column == "server" else "right")
    for name, sizes in servers.items():
        extra_us = (sizes[8]["cpu_ms"] - sizes[1]["cpu_ms"]) * 1000 / 7
        for per_request, figures in sizes.items():
            table.add_row(name, str(per_request), f"{figures['messages_s']:,.0f}",
                          f"{figures['messages_s'] / noop[per_request]['messages_s']:.2f}", f"{figures['cpu_ms']:.3f}",
                          _ratio(figures["cpu_ms"], noop[per_request]["cpu_ms"]),
                          f"{extra_us:.1f}" if per_request == 8 else "", f"{figures['owner_cpu_ms']:.3f}")
    console.print(table)
    settings = report["settings"]
    console.print(f"load average before {settings['load_before']}, after {settings['load_after']}; {settings['cpus']} "
                  f"CPUs; best of {settings['rounds']} round(s) (rate and CPU each), servers in rotating order")


@click.command("serve")
@click.option("--messages", default=8000, show_default=True, type=click.IntRange(min=64),
              help="Messages per server, request size and round.")
@click.option("--body-size", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--baseline-python", "baselines", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Also serve with this interpreter (another checkout's plugmq serve, one process); repeatable.")
@click.option("--workers", "worker_counts", multiple=True, type=click.IntRange(min=1), default=(1, 2),
              show_default=True, help="[server] workers of this checkout's servers; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(messages: int, body_size: int, rounds: int, baselines: tuple[str, ...], worker_counts: tuple[int, ...],
            as_json: bool) -> None:
    """Server CPU per SendMessage and send rates of plugmq serve (workers 1 and 2), as ratios to a no-op gRPC server."""
    report = measure(messages, body_size, rounds, baselines, worker_counts)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report, Console(width=160))
