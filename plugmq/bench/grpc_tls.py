"""``plugmq bench grpc --tls``: what TLS costs the served send rate.

Two ``plugmq serve`` children on identical brokers, one plain and one with ``[server.tls]``
(a certificate for 127.0.0.1 from a CA made for the run with trustme). Each round measures on
both, in alternating order: the official client's ``Producer.send`` from 8 threads (its TLS
channel trusts gRPC's default roots, so the run's CA goes in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
before any channel is made) and the same load through the generated stub. The report gives each
rate's median over the rounds and the TLS / plain ratio, with the load average; the goal is a
ratio of at least 0.85.

On a shared, loaded machine the rates swing round to round whatever the server does; the
server's own CPU time per message (``/proc/<pid>/stat``, all its threads) does not, and its
inverse is the rate a server that has the CPU to itself can serve. The report gives that
capacity ratio (plain CPU per message / TLS CPU per message) beside the rate ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import attrs
import click

from plugmq.bench.grpc import (
    _SEND_THREADS,
    ServeChild,
    _client_message,
    _client_send,
    _config,
    _producer,
    _stub_send,
)
from plugmq.measure.probes import LoadWindow, process_cpu_s

__all__ = ["TlsReport", "measure_tls", "run_tls", "write_certificates"]

GOAL = 0.85


@attrs.define
class TlsReport:
    settings: dict[str, Any]
    rates: dict[str, list[float]] = attrs.field(factory=dict)  # "<scenario> plain|tls" -> one rate per round
    cpu_ms: dict[str, list[float]] = attrs.field(factory=dict)  # the same keys: server CPU ms per message

    def median(self, key: str) -> float:
        return statistics.median(self.rates[key])

    def cpu(self, key: str) -> float:
        return statistics.median(self.cpu_ms[key])

    def ratio(self, scenario: str) -> float:
        return self.median(f"{scenario} tls") / self.median(f"{scenario} plain")

    def add(self, key: str, rate: float, cpu_s: float, messages: int) -> None:
        self.rates.setdefault(key, []).append(rate)
        self.cpu_ms.setdefault(key, []).append(cpu_s * 1000 / messages)

    def capacity_ratio(self, scenario: str) -> float:
        """Plain server CPU per message over TLS's: the served rate TLS keeps, on a machine to itself."""
        return self.cpu(f"{scenario} plain") / self.cpu(f"{scenario} tls")


def write_certificates(directory: Path) -> bytes:
    """A CA made for the run, and a certificate for 127.0.0.1 it signed: ``server.pem``, ``server.key``
    and ``ca.pem`` in ``directory``; the CA's PEM."""
    try:
        import trustme
    except ModuleNotFoundError as exc:
        raise click.ClickException("TLS benchmarks need trustme (the bench extra)") from exc
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    issued.private_key_pem.write_to_path(str(directory / "server.key"))
    issued.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return ca.cert_pem.bytes()


def measure_tls(messages: int, body_size: int, store: str, flush: str, rounds: int) -> TlsReport:
    body = os.urandom(body_size)
    report = TlsReport({"messages": messages, "body_size": body_size, "store": store, "flush": flush,
                        "rounds": rounds, "threads": _SEND_THREADS, "cpus": os.cpu_count()})
    load = LoadWindow()
    with tempfile.TemporaryDirectory(prefix="plugmq-bench-tls-") as tmp:
        root = Path(tmp)
        for name in ("plain", "tls"):
            (root / name).mkdir()
        ca = write_certificates(root / "tls")
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(root / "tls" / "ca.pem")
        plain_config = _config(root / "plain", store, flush)
        tls_config = _config(root / "tls", store, flush)
        with open(tls_config, "a", encoding="utf-8") as config:
            config.write('[server.tls]\ncert = "server.pem"\nkey = "server.key"\n')
        children = {"plain": ServeChild(plain_config, root / "plain" / "serve.log"),
                    "tls": ServeChild(tls_config, root / "tls" / "serve.log", tls_ca=ca)}
        try:
            with _producer(children["plain"].address) as plain, _producer(children["tls"].address, tls=True) as secure:
                producers = {"plain": plain, "tls": secure}
                for producer in producers.values():
                    producer.send(_client_message(body))  # warm-up: route, channel, handshake, topic creation
                for round_ in range(rounds):
                    order = ("plain", "tls") if round_ % 2 == 0 else ("tls", "plain")
                    for kind in order:
                        pid = children[kind].process.pid
                        began = process_cpu_s(pid)
                        rate = _client_send(producers[kind], messages, _SEND_THREADS, body)
                        report.add(f"official client send {kind}", rate, process_cpu_s(pid) - began, messages)
                        began = process_cpu_s(pid)
                        rate = _stub_send(children[kind].address, messages, _SEND_THREADS, body,
                                          tls_ca=ca if kind == "tls" else None, prefix=f"stub-r{round_}")
                        report.add(f"generated stub send {kind}", rate, process_cpu_s(pid) - began, messages)
        finally:
            for child in children.values():
                child.stop()
    windows = load.finish().as_dict()
    report.settings.update(load_before=windows["before"], load_after=windows["after"])
    return report


def run_tls(messages: int, body_size: int, store: str, flush: str, rounds: int, as_json: bool) -> None:
    """The ``--tls`` mode of ``plugmq bench grpc``."""
    report = measure_tls(messages, body_size, store, flush, rounds)
    scenarios = ("official client send", "generated stub send")
    if as_json:
        payload = attrs.asdict(report)
        payload["ratios"] = {scenario: report.ratio(scenario) for scenario in scenarios}
        payload["capacity_ratios"] = {scenario: report.capacity_ratio(scenario) for scenario in scenarios}
        click.echo(json.dumps(payload, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    s = report.settings
    table = Table(title=f"TLS vs plain: {s['messages']:,} x {s['body_size']} B per round, {s['threads']} threads, "
                        f"{s['rounds']} rounds alternating, {s['store']} flush={s['flush']}; load "
                        f"{s['load_before']} -> {s['load_after']}")
    for column in ("scenario", "plain msg/s", "TLS msg/s", "TLS / plain", "per round", "server CPU ms/msg plain",
                   "TLS", "capacity ratio"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for scenario in scenarios:
        per_round = [f"{t / p:.2f}" for p, t in zip(report.rates[f"{scenario} plain"], report.rates[f"{scenario} tls"],
                                               strict=True)]
        table.add_row(scenario, f"{report.median(f'{scenario} plain'):,.0f}", f"{report.median(f'{scenario} tls'):,.0f}",
                      f"{report.ratio(scenario):.2f}", " ".join(per_round), f"{report.cpu(f'{scenario} plain'):.3f}",
                      f"{report.cpu(f'{scenario} tls'):.3f}", f"{report.capacity_ratio(scenario):.2f}")
    console = Console()
    console.print(table)
    console.print("(medians over the rounds; rates and CPU per message of the server child; capacity ratio: plain "
                  "CPU per message / TLS CPU per message)")
    for what, ratio in (("rate", report.ratio), ("capacity", report.capacity_ratio)):
        worst = min(ratio(scenario) for scenario in scenarios)
        console.print(f"goal: TLS costs at most {1 - GOAL:.0%} of the served send rate ({what} ratio): "
                      f"{'met' if worst >= GOAL else 'NOT met'} (worst {worst:.2f})")
