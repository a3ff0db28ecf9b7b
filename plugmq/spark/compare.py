"""The whole comparison: matrix on Spark, sweep, tables, Parquet, report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pandas as pd

from plugmq.core.errors import ConfigError
from plugmq.spark.execute import ExecOptions
from plugmq.spark.experiments import (
    Experiment,
    ExperimentsFile,
    SweepSpec,
    expand_matrix,
)
from plugmq.spark.job import aggregate, collect_matrix, split_tables, write_tables
from plugmq.spark.progress import ProgressEvent, ProgressServer

__all__ = ["CompareOutcome", "progress_host", "run_compare", "select", "sweep_spec"]


@attrs.define
class CompareOutcome:
    experiments: list[Experiment]
    tables: dict[str, pd.DataFrame]
    aggregated: dict[str, pd.DataFrame]
    sweep: dict[str, pd.DataFrame] | None
    findings: list[str]
    report: Path
    parquet: list[Path]
    matrix_wall_s: float
    sweep_wall_s: float


def select(spec: ExperimentsFile, only: Sequence[str]) -> ExperimentsFile:
    """Keep only the named matrices (``--only``)."""
    if not only:
        return spec
    names = {m.name for m in spec.matrices}
    for name in only:
        if name not in names:
            raise ConfigError(f"--only {name!r}: no matrix of that name; the file defines {', '.join(sorted(names))}")
    return attrs.evolve(spec, matrices=tuple(m for m in spec.matrices if m.name in only))


def sweep_spec(spec: ExperimentsFile, sweep_max: int | None) -> SweepSpec | None:
    """The file's sweep, resized by ``--sweep-max`` (0 turns it off; a file without one gets the default)."""
    if sweep_max is None:
        return spec.sweep if spec.sweep is not None and spec.sweep.enabled else None
    if sweep_max <= 0:
        return None
    base = spec.sweep or SweepSpec()
    return attrs.evolve(base, max_queues=sweep_max, max_consumers=sweep_max)


_ISOLATION_TEXT = {
    "lane": "lane: real-clock experiments one at a time in their own lane, beside virtual-clock ones; "
            "host-wide real-clock lock",
    "exclusive": "exclusive: the real-clock lane after every virtual-clock experiment; host-wide real-clock lock",
    "none": "none: real-clock experiments in parallel with everything, no lock",
}


def progress_host(spark: Any, master: str) -> str:
    """The address executors reach the driver at (loopback in local mode)."""
    if master.startswith("local"):
        return "127.0.0.1"
    return str(spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1"))


def run_compare(spark: Any, spec: ExperimentsFile, out: Path, *, options: ExecOptions, seed: int | None = None,
                sweep_max: int | None = None, master: str = "",
                on_event: Callable[[ProgressEvent], None] | None = None, progress_port: int = 0,
                on_stage: Callable[[str], None] | None = None) -> CompareOutcome:
    """Run the matrix and the sweep on ``spark``, write Parquet and the report into ``out``.

    ``on_event`` gets every experiment's progress events as they happen (from a thread of the
    progress server; one at a time); ``on_stage`` a line when the sweep, the aggregation and the
    report start.
    """
    from plugmq.spark.report import write_report
    from plugmq.spark.sweep import run_sweep

    def stage(text: str) -> None:
        if on_stage is not None:
            on_stage(text)

    experiments = expand_matrix(spec, seed=seed)
    began = time.perf_counter()
    if on_event is not None:
        with ProgressServer(progress_host(spark, master), on_event, progress_port) as server:
            long = collect_matrix(spark, experiments, attrs.evolve(options, progress=server.address))
    else:
        long = collect_matrix(spark, experiments, options)
    matrix_wall = time.perf_counter() - began
    tables = split_tables(long)
    stage(f"{len(experiments)} experiments in {matrix_wall:.1f} s; aggregating")
    aggregated = aggregate(spark, tables)
    sweep = None
    sweep_note = ""
    sweep_wall = 0.0
    sspec = sweep_spec(spec, sweep_max)
    if sspec is not None:
        stage(f"allocation sweep: {sspec.max_queues} queues x {sspec.max_consumers} consumers")
        began = time.perf_counter()
        sweep = run_sweep(spark, sspec)
        sweep_wall = time.perf_counter() - began
        sweep_note = (f"{sspec.max_queues} queues x {sspec.max_consumers} consumers, strategies "
                      f"{', '.join(sspec.strategies)}, CONSISTENT_HASH with {sspec.virtual_nodes} virtual nodes; "
                      f"{sweep_wall:.1f} s")
    stage("writing the tables and the report")
    written = write_tables(out, {**tables, "summary": aggregated["summary"], "status": aggregated["status"]})
    if sweep:
        written += write_tables(out, {f"sweep_{k}": v for k, v in sweep.items() if isinstance(v, pd.DataFrame)})
    exp_table = tables["experiments"]
    run_info = {"experiments file": spec.source, "spark master": master, "seed": spec.seed if seed is None else seed,
                "task slots (Spark default parallelism)": spark.sparkContext.defaultParallelism,
                "experiments": len(experiments), "matrix wall time (s)": round(matrix_wall, 1),
                "experiment wall times, summed (s)": round(float(exp_table["wall_s"].fillna(0).sum()), 1),
                "waits for the real-clock lock, summed (s)": round(float(exp_table["lock_wait_s"].fillna(0).sum()), 1),
                "real-clock isolation": _ISOLATION_TEXT.get(options.perf_isolation, options.perf_isolation),
                "process per experiment": options.isolate, "time-series window (s)": options.window_s}
    report, findings = write_report(out, matrices=spec.matrices, tables=tables, aggregated=aggregated, sweep=sweep,
                                    run_info=run_info, sweep_note=sweep_note)
    return CompareOutcome(experiments, tables, aggregated, sweep, findings, report, written, matrix_wall, sweep_wall)
