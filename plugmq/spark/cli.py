"""``plugmq compare EXPERIMENTS --out DIR``: run an experiments file on Spark and write the report."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plugmq.cli.layout import print_table
from plugmq.core.errors import ConfigError

__all__ = ["command"]


def _conf(items: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE (a Spark configuration)", param_hint="--conf")
        conf[key] = value
    return conf


@click.command("compare")
@click.argument("experiments_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the Parquet tables, report.html and charts.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master: local[N], spark://host:7077, yarn, k8s://...")
@click.option("--seed", type=int, default=None, help="Override the file's seed (run order).")
@click.option("--only", multiple=True, help="Run only this matrix (repeatable).")
@click.option("--sweep-max", type=int, default=None,
              help="Queues and consumers of the allocation sweep (0: no sweep; default: the file's [sweep]).")
@click.option("--isolate/--in-process", default=True, show_default=True,
              help="Run each experiment in its own Python process (crash, hang and memory isolation).")
@click.option("--experiment-timeout", type=float, default=1800.0, show_default=True,
              help="Seconds after which an isolated experiment is killed and reported failed.")
@click.option("--perf-isolation", type=click.Choice(["lane", "exclusive", "none"]), default="lane", show_default=True,
              help="lane: real-clock experiments one at a time in their own lane beside virtual-clock ones; "
                   "exclusive: that lane after every virtual-clock experiment; none: all in parallel, no lock "
                   "(recorded in the report).")
@click.option("--real-clock-lock", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Host-wide lock file that real-clock experiments hold, so two comparisons on one host never "
                   "measure speed at once (default: plugmq-real-clock.lock in the system temp dir).")
@click.option("--progress-port", type=int, default=0, show_default=True,
              help="Driver port the tasks report progress to (0: any free port; set one a firewall lets through).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where experiments create their broker directories (default: the system temp dir).")
@click.option("--keep-data", is_flag=True, help="Keep each experiment's broker directory.")
@click.option("--conf", "conf", multiple=True, help="Extra Spark configuration KEY=VALUE (repeatable).")
@click.option("--dry-run", is_flag=True, help="Validate the file and list the experiments in run order; run nothing.")
def command(experiments_file: Path, out: Path, master: str, seed: int | None, only: tuple[str, ...],
            sweep_max: int | None, isolate: bool, experiment_timeout: float, perf_isolation: str,
            real_clock_lock: Path | None, progress_port: int, work_dir: Path | None, keep_data: bool,
            conf: tuple[str, ...], dry_run: bool) -> None:
    """Compare plugin sets on workloads (the file's matrix), one Spark task per experiment."""
    from plugmq.spark.compare import run_compare, select, sweep_spec
    from plugmq.spark.execute import ExecOptions
    from plugmq.spark.experiments import expand_matrix, load_experiments

    console = Console()
    try:
        spec = select(load_experiments(experiments_file), only)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    experiments = expand_matrix(spec, seed=seed)
    if dry_run:
        table = Table(title=f"{len(experiments)} experiments in run order", show_edge=False)
        for column in ("#", "experiment", "clock", "store, flush, delay"):
            table.add_column(column, no_wrap=column in ("#", "experiment"))
        for e in experiments:
            in_lane = e.workload.clock == "real" and perf_isolation != "none"
            table.add_row(str(e.order), e.experiment_id, f"{e.workload.clock}{' (lane)' if in_lane else ''}",
                          f"{e.plugin_set.store} {e.effective_flush} {e.plugin_set.delay or 'no-delay'}")
        print_table(table, console)
        sweep = sweep_spec(spec, sweep_max)
        console.print(f"sweep: {f'{sweep.max_queues} x {sweep.max_consumers}' if sweep else 'off'}")
        return
    # Executors read these paths in their own working directory (a standalone worker's is not
    # this one): absolute, or one experiment's lock and data would land somewhere else.
    if work_dir is not None:
        work_dir = work_dir.resolve()
        work_dir.mkdir(parents=True, exist_ok=True)
    options = ExecOptions(work_dir=str(work_dir) if work_dir else None, window_s=spec.window_s, isolate=isolate,
                          timeout_s=experiment_timeout, perf_isolation=perf_isolation, keep_data=keep_data)
    if real_clock_lock is not None:
        options = attrs.evolve(options, lock_path=str(real_clock_lock.resolve()))
    from plugmq.spark.job import make_session
    from plugmq.spark.progress import ProgressEvent, ProgressTracker, format_s

    # One line per finished experiment (and per wait for the real-clock lock) whether or not a
    # terminal is attached; the live bar only on a terminal, where the lines scroll above it.
    live = console.is_terminal
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=not live)

    def say(text: str) -> None:
        if live:
            progress.console.print(text, markup=False, highlight=False)
        else:
            click.echo(text)

    began = time.monotonic()

    def stage(text: str) -> None:
        say(f"[{format_s(time.monotonic() - began)}] {text}")

    with progress:
        stage(f"starting Spark: {master}")
        spark = make_session(master, conf=_conf(conf))
        slots = spark.sparkContext.defaultParallelism
        tracker = ProgressTracker(experiments, slots, serial_real=perf_isolation != "none", began=began)
        bar = progress.add_task("experiments", total=len(experiments))
        lane = sum(1 for e in experiments if e.workload.clock == "real")
        stage(f"{len(experiments)} experiments on {slots} task slot(s): {lane} real-clock "
            f"({'one at a time, in their own lane' if perf_isolation != 'none' else 'in parallel'}), "
            f"{len(experiments) - lane} virtual-clock in parallel")

        def on_event(event: ProgressEvent) -> None:
            line = tracker.line(event)
            if line is not None:
                say(line)
            progress.update(bar, completed=len(tracker.done))

        try:
            outcome = run_compare(spark, spec, out, options=options, seed=seed, sweep_max=sweep_max, master=master,
                                  on_event=on_event, progress_port=progress_port, on_stage=stage)
        finally:
            spark.stop()
    statuses = outcome.tables["experiments"]["status"].value_counts().to_dict()
    console.print(f"[bold]{len(outcome.experiments)} experiments[/bold] in {outcome.matrix_wall_s:.1f} s: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    console.print("[bold]findings[/bold] (report.html has them as a table, with the charts)")
    for line in outcome.findings:
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"report: {outcome.report}")
    console.print("tables: " + ", ".join(p.name for p in outcome.parquet))

