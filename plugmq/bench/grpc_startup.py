"""``plugmq bench grpc --startup-only``: how long ``plugmq serve`` takes to answer, and the CPU it spends.

Three situations per round, each a fresh ``plugmq serve`` child probed with Heartbeat until it
answers: the first start on an empty data dir; a restart after SIGTERM on a data dir holding a
backlog (``--backlog-mb`` of messages written in-process beforehand, plus what earlier rounds
sent); a restart after ``kill -9`` during an 8-thread send load on that data dir (the store
recovers from its checkpoint). The server's CPU time until it answered (``/proc/<pid>/stat``,
all threads) is what start-up costs whatever the machine's load; wall time on a busy machine is
about that CPU time times the load factor.

``--baseline-python`` runs the same rounds with another interpreter (e.g. another checkout's
``.venv/bin/python``), alternating with this one round by round (which goes first alternates
too), so the two are compared in one run under the same load. Before the rounds, each interpreter starts once to write its ``.pyc``
files (not counted). Unlike the full ``bench grpc``, the acknowledged sends are not drained
afterwards (a large backlog would take minutes); the full run does that check.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import click

from plugmq.bench.grpc import TOPIC, ServeChild, _config, _crash_and_restart
from plugmq.broker.broker import Broker
from plugmq.core import Message as PlugmqMessage
from plugmq.measure.probes import LoadWindow, load_average

__all__ = ["SITUATIONS", "StartupReport", "measure_startup", "print_startup"]

SITUATIONS = ("first start, empty data dir", "restart after SIGTERM", "restart after kill -9 during sends")
_BATCH_BYTES = 1 << 20  # per send_batch while writing the backlog
_BACKLOG_BODY = 1024  # bytes per backlog message


@attrs.define
class Sample:
    python: str  # "this" or "baseline"
    situation: str
    round: int
    serving_s: float  # spawn -> first answered request
    cpu_s: float  # the server's CPU seconds until then
    load: float  # 1-minute load average when it started
    phases: dict[str, float] = attrs.field(factory=dict)  # as the server logged them (wall seconds)


@attrs.define
class StartupReport:
    settings: dict[str, Any]
    samples: list[Sample] = attrs.field(factory=list)

    def median(self, python: str, situation: str, field: str) -> float | None:
        """The median of a sample field, or of a logged phase (``imports_s``, ``broker_open_s``)."""
        values = [s.phases.get(field) if field.endswith("_s") and not hasattr(s, field) else getattr(s, field)
                  for s in self.samples if s.python == python and s.situation == situation]
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None


def _write_backlog(data_dir: Path, store: str, flush: str, megabytes: int, body_size: int = _BACKLOG_BODY) -> int:
    """Fill ``data_dir`` in-process with about ``megabytes`` MiB of bodies; returns the message count."""
    body = os.urandom(body_size)
    per_batch = max(1, _BATCH_BYTES // body_size)
    batches = max(0, megabytes * (1 << 20) // (per_batch * body_size))
    with Broker.open(data_dir, plugins=[store, "filter_tag"], options={store: {"flush": flush}}) as broker:
        broker.create_topic(TOPIC, 8)
        with broker.producer("bench-grpc-backlog") as producer:
            batch = [PlugmqMessage(TOPIC, body) for _ in range(per_batch)]
            for index in range(batches):
                producer.send_batch(batch, selector=lambda queues, _message, arg: queues[arg % len(queues)],
                                    arg=index)
    return batches * per_batch


def _load() -> float:
    return round(load_average()[0], 2)


def _round(report: StartupReport, label: str, python: str, root: Path, backlog: Path, index: int,
           store: str, flush: str, body: bytes) -> None:
    empty = root / f"empty-{label}-{index}"
    empty.mkdir()
    config = _config(empty, store, flush)
    load = _load()
    child = ServeChild(config, empty / "serve.log", python=python)
    report.samples.append(Sample(label, SITUATIONS[0], index, child.serving_s, child.phases["cpu_s"], load,
                                 child.phases))
    child.stop()

    config = _config(backlog, store, flush)
    log = backlog / f"serve-{label}.log"
    load = _load()
    child = ServeChild(config, log, python=python)
    report.samples.append(Sample(label, SITUATIONS[1], index, child.serving_s, child.phases["cpu_s"], load,
                                 child.phases))
    load = _load()
    child, _acked, _failures, _reconnect_s = _crash_and_restart(child, config, log, body, 1.0)
    report.samples.append(Sample(label, SITUATIONS[2], index, child.serving_s, child.phases["cpu_s"], load,
                                 child.phases))
    child.stop()  # a clean stop: the next round's "restart after SIGTERM" starts from it


def measure_startup(backlog_mb: int, body_size: int, store: str, flush: str, rounds: int,
                    baseline_python: str | None) -> StartupReport:
    pythons = {"this": sys.executable}
    if baseline_python is not None:
        pythons = {"baseline": baseline_python, **pythons}
    report = StartupReport({"backlog_mb": backlog_mb, "body_size": body_size, "store": store, "flush": flush,
                            "rounds": rounds, "pythons": pythons, "cpus": os.cpu_count()})
    load = LoadWindow()
    body = os.urandom(body_size)
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-startup-") as tmp:
        root = Path(tmp)
        backlog = root / "backlog"
        backlog.mkdir()
        report.settings["backlog_messages"] = _write_backlog(backlog / "data", store, flush, backlog_mb)
        for label, python in pythons.items():  # writes each interpreter's .pyc files; not counted
            warm = root / f"warm-{label}"
            warm.mkdir()
            ServeChild(_config(warm, store, flush), warm / "serve.log", python=python).stop()
        for index in range(rounds):
            order = list(pythons.items())
            for label, python in order if index % 2 == 0 else order[::-1]:  # neither always goes first
                _round(report, label, python, root, backlog, index, store, flush, body)
    windows = load.finish().as_dict()
    report.settings.update(load_before=windows["before"], load_after=windows["after"])
    return report


def print_startup(report: StartupReport) -> None:
    s = report.settings
    click.echo(f"plugmq serve start-up, {s['rounds']} round(s); backlog {s['backlog_mb']} MiB "
               f"({s['backlog_messages']:,} x {_BACKLOG_BODY} B, {s['store']} flush={s['flush']}) plus each "
               f"round's kill -9 sends of {s['body_size']} B; {s['cpus']} CPUs, load {s['load_before']} -> {s['load_after']}")
    for label, python in s["pythons"].items():
        click.echo(f"  {label}: {python}")
    click.echo("medians; imports and broker open are the server's own wall-clock phases")
    header = (f"{'situation':<38} {'python':<9} {'serving s':>10} {'server CPU s':>13} {'imports s':>10} "
              f"{'broker open s':>14} {'loads':>12}")
    click.echo(header)
    for situation in SITUATIONS:
        for label in s["pythons"]:
            values = [report.median(label, situation, f) for f in ("serving_s", "cpu_s", "imports_s", "broker_open_s")]
            loads = [x.load for x in report.samples if x.python == label and x.situation == situation]
            click.echo(f"{situation:<38} {label:<9} " + " ".join(
                f"{'?' if v is None else f'{v:.2f}':>{w}}" for v, w in zip(values, (10, 13, 10, 14)))
                + f" {min(loads):>6.2f}-{max(loads):<6.2f}")
        if "baseline" in s["pythons"]:
            ratios = []
            for field in ("serving_s", "cpu_s"):
                this, base = report.median("this", situation, field), report.median("baseline", situation, field)
                ratios.append(f"{this / base:.2f}x" if this and base else "?")
            click.echo(f"{'':<38} {'this/base':<9} {ratios[0]:>10} {ratios[1]:>13}")
    slowest = max((x.serving_s for x in report.samples if x.python == "this"), default=0.0)
    click.echo(f"goal: serving within 1 s of start and after kill -9: {'met' if slowest <= 1.0 else 'NOT met'} "
               f"(slowest {slowest:.2f} s at load up to "
               f"{max(x.load for x in report.samples if x.python == 'this'):.2f})")


def run_startup(backlog_mb: int, body_size: int, store: str, flush: str, rounds: int,
                baseline_python: str | None, as_json: bool) -> None:
    """The ``--startup-only`` mode of ``plugmq bench grpc``."""
    import json

    started = time.perf_counter()
    report = measure_startup(backlog_mb, body_size, store, flush, rounds, baseline_python)
    report.settings["bench_s"] = round(time.perf_counter() - started, 1)
    if as_json:
        click.echo(json.dumps(attrs.asdict(report), indent=2))
    else:
        print_startup(report)
