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

__all__ = ["CompareOutcome", "run_compare", "select"]


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


def run_compare(spark: Any, spec: ExperimentsFile, out: Path, *, options: ExecOptions, seed: int | None = None,
                sweep_max: int | None = None, master: str = "",
                on_progress: Callable[[str, int, int, int], None] | None = None) -> CompareOutcome:
    """Run the matrix and the sweep on ``spark``, write Parquet and the report into ``out``."""
    from plugmq.spark.report import write_report
    from plugmq.spark.sweep import run_sweep

    experiments = expand_matrix(spec, seed=seed)
    began = time.perf_counter()
    progress = (lambda done, running, total: on_progress("experiments", done, running, total)) if on_progress else None
    long = collect_matrix(spark, experiments, options, progress)
    matrix_wall = time.perf_counter() - began
    tables = split_tables(long)
    aggregated = aggregate(spark, tables)
    sweep = None
    sweep_wall = 0.0
    sspec = sweep_spec(spec, sweep_max)
    if sspec is not None:
        if on_progress:
            on_progress("sweep", 0, 1, 1)
        began = time.perf_counter()
        sweep = run_sweep(spark, sspec)
        sweep_wall = time.perf_counter() - began
        sweep["note"] = (f"{sspec.max_queues} queues x {sspec.max_consumers} consumers, strategies "  # type: ignore[assignment]
                         f"{', '.join(sspec.strategies)}, CONSISTENT_HASH with {sspec.virtual_nodes} virtual nodes; "
                         f"{sweep_wall:.1f} s")
        if on_progress:
            on_progress("sweep", 1, 0, 1)
    written = write_tables(out, {**tables, "summary": aggregated["summary"], "status": aggregated["status"]})
    if sweep:
        written += write_tables(out, {f"sweep_{k}": v for k, v in sweep.items() if isinstance(v, pd.DataFrame)})
    run_info = {"experiments file": spec.source, "spark master": master, "seed": spec.seed if seed is None else seed,
                "experiments": len(experiments), "matrix wall time (s)": round(matrix_wall, 1),
                "real-clock isolation": options.perf_isolation, "process per experiment": options.isolate,
                "time-series window (s)": options.window_s}
    report, findings = write_report(out, matrices=spec.matrices, tables=tables, aggregated=aggregated, sweep=sweep,
                                    run_info=run_info)
    return CompareOutcome(experiments, tables, aggregated, sweep, findings, report, written, matrix_wall, sweep_wall)
