"""``plugmq bench backlog``: sends and cold reads with a large backlog (seed 002 §4.9).

A broker is judged by its backlog: whether sends suffer while messages pile up, and how fast a
consumer that fell behind reads the pile back from disk. On store_mmap (flush async, one queue,
``--body-size`` bodies) this measures:

* **put**: ``Broker.put_batch`` into a store holding the backlog vs into an empty store (the
  same messages, each in a fresh child process, each followed by ``sync`` so no figure shares
  the disk with the previous one's write-back); the goal is >= 0.9x;
* **cold pull**: the page cache dropped (the store's mappings released, then ``posix_fadvise``
  DONTNEED on its files: no other process's cache is touched), ``Broker.pull`` (32 messages a
  call) reads the whole backlog; MB/s of commit-log records against a plain sequential read
  (1 MiB ``readinto`` calls) of the same commit-log bytes, cold as well; the goal is >= 0.5x.

Every figure runs in a child interpreter, so ``--baseline-python`` (another checkout's) runs the
same children against the same backlog in the same run, alternating; the best round is kept.
The backlog is written once (by this checkout) in a temporary directory and deleted at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.measure.children import interpreter_path
from plugmq.measure.probes import LoadWindow

__all__ = ["command", "measure"]

TOPIC = "Backlog"
_CALL = 32  # messages per pull, as a consumer asks

# The children: one source, run by whichever interpreter is measured (it uses only public broker
# API, plus the store's mappings to release them before the cache is dropped).
_CHILD = r"""
import json, mmap, os, sys, time
from pathlib import Path
from plugmq.broker.broker import Broker
from plugmq.core import Message, MessageQueue

def evict(root):
    os.sync()
    for path in Path(root).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

def broker(root):
    return Broker.open(Path(root), plugins=["store_mmap"], options={"store_mmap": {"flush": "async"}})

def batches(body_size, batch, count, seed):
    bodies = [os.urandom(body_size) for _ in range(64)]
    return [[Message(TOPIC, bodies[(seed + i + k) & 63]) for k in range(batch)] for i in range(count // batch)]

CALL = 32
mode, root, TOPIC = sys.argv[1:4]
args = [int(a) for a in sys.argv[4:]]
out = {}
if mode == "fill":  # backlog bytes of bodies, body size, batch
    size, body_size, batch = args
    with broker(root) as b:
        b.create_topic(TOPIC, 1)
        bodies = [os.urandom(body_size) for _ in range(64)]
        start = time.perf_counter()
        sent = 0
        while sent * body_size < size:
            b.put_batch([Message(TOPIC, bodies[(sent + k) & 63]) for k in range(batch)], 0)
            sent += batch
        out = {"messages": sent, "rate": sent / (time.perf_counter() - start), "end": b.store.commit_log.wrote}
    os.sync()  # the next figures must not share the disk with this write-back
elif mode == "put":  # messages, body size, batch
    messages, body_size, batch = args
    with broker(root) as b:
        if TOPIC not in b.store.queues():
            b.create_topic(TOPIC, 1)
        calls = batches(body_size, batch, messages, os.getpid())
        for messages_of_call in calls[: max(len(calls) // 20, 1)]:
            b.put_batch(messages_of_call, 0)  # warm-up
        start = time.perf_counter()
        for messages_of_call in calls:
            b.put_batch(messages_of_call, 0)
        out = {"rate": len(calls) * batch / (time.perf_counter() - start)}
    os.sync()
elif mode == "pull":  # messages to read
    (wanted,) = args
    with broker(root) as b:
        for seg in b.store.commit_log.segments:  # pages mapped by this process stay cached otherwise
            seg.mm.madvise(mmap.MADV_DONTNEED)
        evict(root)
        queue = MessageQueue(TOPIC, b.name, 0)
        offset = count = size = 0
        start = time.perf_counter()
        while count < wanted:
            got = b.pull(queue, offset, CALL).messages
            if not got:
                break
            count += len(got)
            size += sum(m.size for m in got)
            offset = got[-1].queue_offset + 1
        seconds = time.perf_counter() - start
        out = {"messages": count, "mb_s": size / seconds / 1e6, "rate": count / seconds}
elif mode == "read":  # commit-log bytes to read
    (end,) = args
    logs = sorted(p for p in Path(root).rglob("commitlog") if p.is_dir())[0]
    evict(root)
    buffer = bytearray(1 << 20)
    left = end
    start = time.perf_counter()
    for path in sorted(logs.iterdir()):
        with open(path, "rb", buffering=0) as f:
            while left > 0:
                got = f.readinto(memoryview(buffer)[: min(len(buffer), left)])
                if not got:
                    break
                left -= got
    seconds = time.perf_counter() - start
    out = {"mb_s": (end - left) / seconds / 1e6}
print(json.dumps(out))
""".replace("CALL = 32", f"CALL = {_CALL}")


def _child(python: str, mode: str, root: Path, topic: str, *args: int) -> dict[str, Any]:
    # From an empty directory: ``python -c`` puts the working directory first on sys.path.
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-backlog-cwd-") as cwd:
        done = subprocess.run([interpreter_path(python), "-c", _CHILD, mode, str(root), topic, *map(str, args)],
                              capture_output=True, text=True, timeout=3600, check=False, cwd=cwd)
    if done.returncode != 0:
        raise click.ClickException(f"the {mode} child of {python} failed (exit {done.returncode}):\n"
                                   f"{done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure(size: int, body_size: int, batch: int, put_messages: int, rounds: int, baseline: str | None,
            directory: Path | None = None) -> dict[str, Any]:
    """Fill a backlog of ``size`` body bytes, then per round and interpreter: put_batch into an
    empty store and into the backlog, a cold pull of the backlog and a cold sequential read."""
    pythons = {"this": sys.executable, **({"baseline": baseline} if baseline else {})}
    best: dict[str, dict[str, float]] = {label: {} for label in pythons}
    load = LoadWindow()
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-backlog-", dir=directory) as scratch:
        tmp = Path(scratch).resolve()  # the children run in a directory of their own (see _child)
        backlog = tmp / "backlog"
        filled = _child(sys.executable, "fill", backlog, TOPIC, size, body_size, 1000)
        for round_index in range(rounds):
            order = list(pythons.items())
            if round_index % 2:
                order.reverse()  # neither interpreter always runs first
            for label, python in order:
                empty = tmp / f"empty-{label}-{round_index}"
                figures = {
                    "put_empty": _child(python, "put", empty, "Sends", put_messages, body_size, batch)["rate"],
                    "put_backlog": _child(python, "put", backlog, "Sends", put_messages, body_size, batch)["rate"],
                }
                shutil.rmtree(empty)
                pulled = _child(python, "pull", backlog, TOPIC, filled["messages"])
                if pulled["messages"] != filled["messages"]:
                    raise click.ClickException(f"{label}: pulled {pulled['messages']} of {filled['messages']} messages")
                figures["pull_mb_s"] = pulled["mb_s"]
                figures["pull_msg_s"] = pulled["rate"]
                figures["read_mb_s"] = _child(sys.executable, "read", backlog, TOPIC, filled["end"])["mb_s"]
                for name, value in figures.items():
                    best[label][name] = max(value, best[label].get(name, 0.0))
    windows = load.finish().as_dict()
    return {"settings": {"backlog_bytes": filled["end"], "messages": filled["messages"], "body_size": body_size,
                         "batch": batch, "put_messages": put_messages, "rounds": rounds, "fill_rate": filled["rate"],
                         "store": "store_mmap, flush async, one queue", "pythons": pythons,
                         "load_before": windows["before"], "load_after": windows["after"], "cpus": os.cpu_count()},
            "rates": best}


def _print(report: dict[str, Any], console: Console) -> None:
    rates, settings = report["rates"], report["settings"]
    table = Table(title=f"backlog of {settings['backlog_bytes'] / 2**30:.2f} GiB ({settings['messages']:,} x "
                        f"{settings['body_size']} B, {settings['store']})")
    table.add_column("figure")
    for label in rates:
        table.add_column(label, justify="right")
    rows = [("put_batch msg/s, empty store", "put_empty", "{:,.0f}"),
            ("put_batch msg/s, with the backlog", "put_backlog", "{:,.0f}"),
            ("  backlog / empty (goal >= 0.9)", None, "put"),
            ("cold pull MB/s", "pull_mb_s", "{:,.0f}"), ("cold pull msg/s", "pull_msg_s", "{:,.0f}"),
            ("cold sequential read MB/s (rounds of this column)", "read_mb_s", "{:,.0f}"),
            ("  pull / best sequential read (goal >= 0.5)", None, "pull")]
    best_read = max(figures["read_mb_s"] for figures in rates.values())
    for title, key, form in rows:
        cells = [title]
        for label in rates:
            figures = rates[label]
            if key is not None:
                cells.append(form.format(figures[key]))
            elif form == "put":
                cells.append(f"{figures['put_backlog'] / figures['put_empty']:.2f}x")
            else:  # against the best cold read of the run (it reads the same bytes for every interpreter)
                cells.append(f"{figures['pull_mb_s'] / best_read:.2f}x")
        table.add_row(*cells)
    console.print(table)
    if "baseline" in rates:
        console.print(f"cold pull this / baseline: {rates['this']['pull_mb_s'] / rates['baseline']['pull_mb_s']:.2f}x")
    console.print(f"load average before {settings['load_before']}, after {settings['load_after']}; "
                  f"{settings['cpus']} CPUs; best of {settings['rounds']} round(s), interpreters alternating; "
                  f"backlog written at {settings['fill_rate']:,.0f} msg/s")


@click.command("backlog")
@click.option("--size", default=4 << 30, show_default=True, type=click.IntRange(min=1 << 20),
              help="Backlog size in body bytes.")
@click.option("--body-size", default=1024, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=100, show_default=True, type=click.IntRange(min=1),
              help="Messages per put_batch call in the put figures.")
@click.option("--put-messages", default=200_000, show_default=True, type=click.IntRange(min=100),
              help="Messages per put figure.")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--smoke", is_flag=True, help="A few MiB and one round: checks the benchmark runs (seconds).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the backlog goes (a temporary directory inside it, deleted at the end).")
@click.option("--baseline-python", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Also measure with this interpreter (another checkout's), alternating, and print this/baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(size: int, body_size: int, batch: int, put_messages: int, rounds: int, smoke: bool,
            directory: Path | None, baseline_python: str | None, as_json: bool) -> None:
    """put_batch with a large backlog vs an empty store, and a cold pull of it vs a sequential read."""
    if smoke:
        size, put_messages, rounds = min(size, 4 << 20), min(put_messages, 2000), 1
    report = measure(size, body_size, batch, put_messages, rounds, baseline_python, directory)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report, Console(width=160))
