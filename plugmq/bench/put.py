"""``plugmq bench put``: ``Broker.put`` and ``put_batch`` against the raw mmap loops under them.

Each case runs in a child interpreter, so two checkouts compare in one run: this one and, with
``--baseline-python``, another (e.g. a script that runs this venv's python with ``PYTHONPATH``
set to a checkout of main). Rounds alternate between the interpreters; the best round of each
figure is kept. One child measures, with the same bodies:

* the raw baselines of plugmq.bench.store: a Python loop appending length-prefixed records to an
  mmap (one record per call, and ``--batch`` records per call);
* ``Broker.put(Message(...), 0)`` per message and ``Broker.put_batch([Message(...) x batch], 0)``,
  the messages built inside the timed loop (building and checking them is part of the put path),
  on store_mmap with ``flush = "async"`` (page cache, no fsync; one queue).

Ratios: each put rate over its raw loop, and this interpreter's over the baseline's. Each child
also reports the CPU (process time) per message of every figure, the best round kept: on a
shared machine it moves less than the rates, which also count the time other processes ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.measure.children import interpreter_path
from plugmq.measure.probes import LoadWindow

__all__ = ["command", "measure"]

_CHILD = r"""
import json, os, sys, tempfile, time
from pathlib import Path
from plugmq.bench.store import raw_mmap_batched, raw_mmap_single
from plugmq.broker.broker import Broker
from plugmq.core import Message

messages, size, batch = (int(a) for a in sys.argv[1:4])
bodies = [os.urandom(size) for _ in range(256)]
topic = "BenchPut"
with tempfile.TemporaryDirectory(prefix="plugmq-bench-put-") as tmp:
    root = Path(tmp)
    for name in ("raw1", "rawb"):
        (root / name).mkdir()
    cpu = {}
    started = time.process_time()
    result = {"raw_single": messages / raw_mmap_single(root / "raw1", bodies, messages)}
    cpu["raw_single"], started = (time.process_time() - started) * 1e6 / messages, time.process_time()
    result["raw_batch"] = messages / raw_mmap_batched(root / "rawb", bodies, messages, batch)
    cpu["raw_batch"] = (time.process_time() - started) * 1e6 / messages
    with Broker.open(root / "broker", plugins=["store_mmap"], options={"store_mmap": {"flush": "async"}}) as broker:
        broker.create_topic(topic, 1)
        for body in bodies:
            broker.put(Message(topic, body), 0)  # warm-up
        start, started = time.perf_counter(), time.process_time()
        for i in range(messages):
            broker.put(Message(topic, bodies[i & 255]), 0)
        result["put"] = messages / (time.perf_counter() - start)
        cpu["put"] = (time.process_time() - started) * 1e6 / messages
        calls = messages // batch
        start, started = time.perf_counter(), time.process_time()
        for i in range(calls):
            broker.put_batch([Message(topic, bodies[(i + k) & 255]) for k in range(batch)], 0)
        result["put_batch"] = calls * batch / (time.perf_counter() - start)
        cpu["put_batch"] = (time.process_time() - started) * 1e6 / (calls * batch)
print(json.dumps({"rates": result, "cpu_us": cpu}))
"""

_FIGURES = ("raw_single", "put", "raw_batch", "put_batch")


def _run_child(python: str, messages: int, size: int, batch: int) -> dict[str, dict[str, float]]:
    # Run from an empty directory: ``python -c`` puts the working directory first on sys.path, and
    # a checkout there would be imported instead of the one the interpreter is set up for.
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-put-cwd-") as cwd:
        done = subprocess.run([interpreter_path(python), "-c", _CHILD, str(messages), str(size), str(batch)],
                              capture_output=True, text=True, timeout=900, check=False, cwd=cwd)
    if done.returncode != 0:
        raise click.ClickException(f"the put child of {python} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    figures: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure(messages: int, size: int, batch: int, rounds: int, baseline: str | None) -> dict[str, Any]:
    """The best rate of each figure per interpreter (``this``, and ``baseline`` when given)."""
    pythons = {"this": sys.executable, **({"baseline": baseline} if baseline else {})}
    best: dict[str, dict[str, float]] = {label: {} for label in pythons}
    cpu: dict[str, dict[str, float]] = {label: {} for label in pythons}
    load = LoadWindow()
    for round_index in range(rounds):
        order = list(pythons.items())
        if round_index % 2:
            order.reverse()  # neither interpreter always runs first
        for label, python in order:
            figures = _run_child(python, messages, size, batch)
            for name, rate in figures["rates"].items():
                best[label][name] = max(rate, best[label].get(name, 0.0))
            for name, micros in figures["cpu_us"].items():
                cpu[label][name] = min(micros, cpu[label].get(name, float("inf")))
    windows = load.finish().as_dict()
    return {"settings": {"messages": messages, "body_size": size, "batch": batch, "rounds": rounds,
                         "store": "store_mmap, flush async (page cache, no fsync)", "pythons": pythons,
                         "load_before": windows["before"], "load_after": windows["after"], "cpus": os.cpu_count()},
            "rates": best, "cpu_us": cpu}


def _table(title: str, unit: str, figures: dict[str, dict[str, float]]) -> Table:
    """One row per figure: each interpreter's value and its ratio to its raw loop, and this/baseline."""
    table = Table(title=title)
    table.add_column("figure")
    for label in figures:
        table.add_column(f"{label} {unit}", justify="right")
        table.add_column(f"{label} / raw loop", justify="right")
    if "baseline" in figures:
        table.add_column("this / baseline", justify="right")
    for figure in _FIGURES:
        raw = "raw_single" if figure in ("raw_single", "put") else "raw_batch"
        cells = [figure]
        for label in figures:
            cells += [f"{figures[label][figure]:,.0f}", f"{figures[label][figure] / figures[label][raw]:.3f}"]
        if "baseline" in figures:
            cells.append(f"{figures['this'][figure] / figures['baseline'][figure]:.2f}x")
        table.add_row(*cells)
    return table


def _print(report: dict[str, Any], console: Console) -> None:
    settings = report["settings"]
    console.print(_table(f"Broker.put / put_batch ({settings['body_size']} B bodies, batch {settings['batch']}, "
                         f"{settings['store']})", "msg/s", report["rates"]))
    per_cpu_second = {label: {figure: 1e6 / max(micros, 1e-3) for figure, micros in figures.items()}
                      for label, figures in report["cpu_us"].items()}
    console.print(_table("Messages per CPU second (process time: steadier than the rates on a shared machine)",
                         "msg/CPU-s", per_cpu_second))
    console.print(f"load average before {settings['load_before']}, after {settings['load_after']}; "
                  f"{settings['cpus']} CPUs; best of {settings['rounds']} round(s), interpreters alternating")


@click.command("put")
@click.option("--messages", default=100_000, show_default=True, type=click.IntRange(min=1000),
              help="Messages per figure per round.")
@click.option("--body-size", "size", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=100, show_default=True, type=click.IntRange(min=1),
              help="Messages per put_batch call (and per call of the raw batched loop).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--baseline-python", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Also measure with this interpreter (another checkout's), alternating, and print this/baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(messages: int, size: int, batch: int, rounds: int, baseline_python: str | None, as_json: bool) -> None:
    """Broker.put and put_batch rates as ratios to raw mmap append loops (and to another checkout)."""
    report = measure(messages, size, batch, rounds, baseline_python)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report, Console(width=160))
