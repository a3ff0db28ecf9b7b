"""``report.html`` and its PNG charts: one section per matrix, numbers straight from the tables.

Each section has the run status, a table of medians over repetitions (latency percentiles from
the merged histograms), the charts its kind calls for and a few headline findings computed from
the same numbers. Charts use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plugmq.spark.experiments import Matrix
from plugmq.spark.histogram import bucket_upper_ms

__all__ = ["COLUMNS", "headline_findings", "write_report"]

COLUMNS: dict[str, tuple[str, ...]] = {
    "delay": ("delay_lateness_p50_ms", "delay_lateness_p99_ms", "delay_lateness_p999_ms", "delay_lateness_max_ms",
              "delay_early_deliveries", "delay_delivered", "delay_undelivered", "publish_cost_us_per_msg",
              "consume_missing", "consume_duplicates"),
    "storage": ("publish_rate_msg_s", "publish_rate_mb_s", "publish_latency_p50_ms", "publish_latency_p99_ms",
                "publish_latency_p999_ms", "publish_latency_max_ms", "end_to_end_latency_p50_ms",
                "end_to_end_latency_p99_ms", "consume_rate_msg_s", "backlog_max", "publish_errors", "bytes_written",
                "bytes_on_disk", "resident_memory_mb"),
    "allocation": ("allocation_imbalance_initial", "allocation_imbalance", "allocation_imbalance_max",
                   "allocation_overload", "allocation_overload_max", "allocation_queues_moved_per_change",
                   "allocation_queues_moved_max", "allocation_membership_changes",
                   "allocation_changes_moving_nothing", "allocation_idle_member_changes", "consume_duplicates",
                   "consume_missing", "backlog_max"),
    "filter": ("filter_selectivity", "filter_precheck_pass_rate", "filter_false_positive_rate",
               "filter_scan_us_per_entry", "unfiltered_scan_us_per_entry", "filter_scan_cost_ratio",
               "publish_rate_msg_s", "consume_rate_msg_s"),
    "general": ("publish_rate_msg_s", "publish_latency_p50_ms", "publish_latency_p99_ms", "end_to_end_latency_p99_ms",
                "consume_rate_msg_s", "backlog_max", "delay_lateness_p99_ms", "resident_memory_mb"),
}

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f2f2f2}td:first-child,td:nth-child(2){text-align:left}.bad{color:#b00}.note{color:#555;font-size:13px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}h2{border-bottom:2px solid #446;padding-bottom:.2em;margin-top:2em}
li{margin:.2em 0}code{background:#f5f5f5;padding:0 3px}"""


def _plt() -> Any:
    """matplotlib.pyplot, imported on first use with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return html.escape(str(value))


def _table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in frame.itertuples(index=False))
    return f"<table><tr>{head}</tr>{body}</table>"


def _pivot(summary: pd.DataFrame, matrix: str, columns: Sequence[str]) -> pd.DataFrame:
    part = summary[summary["matrix"] == matrix]
    if part.empty:
        return pd.DataFrame()
    wide = part.pivot_table(index=["workload", "plugin_set"], columns="metric", values="value", aggfunc="first")
    present = [c for c in columns if c in wide.columns]
    return wide[present].reset_index()


# ------------------------------------------------------------------------------------------ charts
def _lateness_cdf(plt: Any, merged: pd.DataFrame, matrix: str, status: pd.DataFrame, path: Path) -> bool:
    part = merged[(merged["matrix"] == matrix) & (merged["histogram"] == "delay_lateness")]
    workloads = sorted(set(status[status["matrix"] == matrix]["workload"]))
    if not workloads:
        return False
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    floor = 1e-3
    for ax, workload in zip(axes[0], workloads, strict=True):
        rows = status[(status["matrix"] == matrix) & (status["workload"] == workload)]
        curves = []
        for plugin_set in sorted(rows["plugin_set"]):
            h = part[(part["workload"] == workload) & (part["plugin_set"] == plugin_set)].sort_values("bucket")
            if h.empty:
                flags = rows[rows["plugin_set"] == plugin_set].iloc[0]
                reason = "unsupported" if flags["unsupported"] else "failed" if flags["failed"] else "no data"
                curves.append((f"{plugin_set} ({reason})", None, None))
                continue
            x = np.array([max(bucket_upper_ms(int(b)), floor) for b in h["bucket"]])
            y = np.cumsum(h["count"].to_numpy()) / h["count"].sum()
            curves.append((plugin_set, x, y))
        right = max([float(x.max()) for _, x, _ in curves if x is not None] + [floor * 10]) * 1.5
        for label, x, y in curves:
            if x is None:
                ax.plot([], [], label=label, linestyle=":")
                continue
            # From (floor, 0) through every bucket edge, flat to the right edge: a curve whose
            # mass is all at lateness 0 still shows as a step at the left.
            ax.step(np.concatenate([[floor], x, [right]]), np.concatenate([[0.0], y, [1.0]]), where="post", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("lateness (ms, log; <=0 plotted at 0.001)")
        ax.set_ylabel("fraction of delayed messages")
        ax.set_title(f"{workload}: lateness CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _bars(plt: Any, wide: pd.DataFrame, metrics: Sequence[tuple[str, str]], title: str, path: Path,
          summary: pd.DataFrame | None = None, matrix: str | None = None) -> bool:
    metrics = [(m, label) for m, label in metrics if m in wide.columns]
    if wide.empty or not metrics:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    labels = [f"{w}\n{p}" for w, p in zip(wide["workload"], wide["plugin_set"], strict=True)]
    for ax, (metric, label) in zip(axes[0], metrics, strict=True):
        values = wide[metric].astype(float).to_numpy()
        errors = None
        if summary is not None:
            part = summary[(summary["matrix"] == matrix) & (summary["metric"] == metric)].set_index(["workload", "plugin_set"])
            low = [part["low"].get((w, p), np.nan) for w, p in zip(wide["workload"], wide["plugin_set"], strict=True)]
            high = [part["high"].get((w, p), np.nan) for w, p in zip(wide["workload"], wide["plugin_set"], strict=True)]
            low_a, high_a = np.array(low, dtype=float), np.array(high, dtype=float)
            if not np.all(np.isnan(low_a)):
                errors = np.vstack([np.clip(values - low_a, 0, None), np.clip(high_a - values, 0, None)])
                errors = np.nan_to_num(errors)
        ax.bar(range(len(values)), np.nan_to_num(values), yerr=errors, capsize=3, color="#5577aa")
        ax.set_xticks(range(len(values)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _filter_cost(plt: Any, wide: pd.DataFrame, experiments: pd.DataFrame, matrix: str, path: Path) -> bool:
    needed = {"filter_selectivity", "filter_scan_us_per_entry", "filter_precheck_pass_rate"}
    if wide.empty or not needed <= set(wide.columns):
        return False
    types = (experiments[experiments["matrix"] == matrix].groupby(["workload", "plugin_set"])["filter_type"].first())
    wide = wide.assign(filter_type=[types.get((w, p)) for w, p in zip(wide["workload"], wide["plugin_set"], strict=True)])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for (ftype, plugin_set), part in wide.groupby(["filter_type", "plugin_set"]):
        part = part.sort_values("filter_selectivity")
        label = f"{ftype} / {plugin_set}"
        axes[0].plot(part["filter_selectivity"], part["filter_scan_us_per_entry"], marker="o", label=label)
        axes[1].plot(part["filter_selectivity"], part["filter_precheck_pass_rate"], marker="o", label=label)
    axes[0].set_ylabel("CPU µs per consume-queue entry scanned")
    axes[1].set_ylabel("broker pre-check pass rate")
    for ax in axes:
        ax.set_xlabel("selectivity (measured fraction matching)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("filter cost vs selectivity")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _sweep_charts(plt: Any, sweep: dict[str, pd.DataFrame], out: Path) -> list[str]:
    names = []
    by_c = sweep.get("by_consumers")
    if by_c is not None and not by_c.empty:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for strategy, part in by_c.groupby("strategy"):
            axes[0].plot(part["consumers"], part["mean_overload"], label=strategy)
            axes[1].plot(part["consumers"], part["mean_moved_over_ideal"], label=strategy)
        axes[0].set_ylabel("busiest member / fair share")
        axes[0].set_title("load of the busiest member (mean over queue counts)", fontsize=10)
        axes[0].set_yscale("log")
        axes[1].set_ylabel("queues moved on a join / ideal")
        axes[1].set_title("churn of one join (0: the joiner got no queue)", fontsize=10)
        axes[1].set_yscale("symlog", linthresh=1)
        for ax in axes:
            ax.set_xlabel("consumers")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "sweep_by_consumers.png", dpi=90)
        plt.close(fig)
        names.append("sweep_by_consumers.png")
    grid = sweep.get("grid")
    if grid is not None and not grid.empty:
        strategies = sorted(grid["strategy"].unique())
        fig, axes = plt.subplots(1, len(strategies), figsize=(5 * len(strategies), 4), squeeze=False)
        for ax, strategy in zip(axes[0], strategies, strict=True):
            part = grid[grid["strategy"] == strategy].pivot(index="queues_bin", columns="consumers_bin",
                                                              values="mean_moved_fraction")
            image = ax.imshow(part.to_numpy(dtype=float), origin="lower", aspect="auto", vmin=0, vmax=1, cmap="viridis",
                              extent=(0, part.columns.max(), 0, part.index.max()))
            ax.set_title(f"{strategy}: fraction of queues moved on a join")
            ax.set_xlabel("consumers")
            ax.set_ylabel("queues")
            fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "sweep_moved_heatmap.png", dpi=90)
        plt.close(fig)
        names.append("sweep_moved_heatmap.png")
    return names


# ------------------------------------------------------------------------------------------ findings
def _best(wide: pd.DataFrame, metric: str, *, lowest: bool) -> tuple[str, float] | None:
    if metric not in wide.columns:
        return None
    part = wide.dropna(subset=[metric])
    if part.empty:
        return None
    row = part.loc[part[metric].idxmin() if lowest else part[metric].idxmax()]
    return f"{row['plugin_set']} on {row['workload']}", float(row[metric])


def headline_findings(matrix: Matrix, wide: pd.DataFrame, status: pd.DataFrame, errors: dict[tuple[str, str], str],
                      experiments: pd.DataFrame) -> list[str]:
    """A few sentences per section, each computed from the section's table."""
    found = []
    part = status[status["matrix"] == matrix.name]
    for row in part[part["unsupported"] > 0].itertuples():
        reason = errors.get((row.workload, row.plugin_set), "")
        found.append(f"{row.plugin_set} on {row.workload}: <b>unsupported</b> — {html.escape(reason[:400])}")
    for row in part[part["failed"] > 0].itertuples():
        found.append(f"<span class=bad>{row.plugin_set} on {row.workload}: {row.failed} failed run(s)</span>")
    if matrix.kind == "delay" and not wide.empty:
        for workload, w in wide.groupby("workload"):
            if "delay_lateness_p99_ms" in w:
                ranked = w.dropna(subset=["delay_lateness_p99_ms"]).sort_values("delay_lateness_p99_ms")
                text = ", ".join(f"{r.plugin_set} {_fmt(r.delay_lateness_p99_ms)} ms" for r in ranked.itertuples())
                if text:
                    found.append(f"{workload}: p99 lateness {text}")
        if "delay_early_deliveries" in wide:
            early = wide["delay_early_deliveries"].sum()
            found.append(f"early deliveries over all runs: {_fmt(early)}" + (" (must be 0)" if early else ""))
    elif matrix.kind == "storage" and not wide.empty and "publish_rate_msg_s" in wide:
        flushes = experiments[experiments["matrix"] == matrix.name].groupby("plugin_set")["flush"].first()
        for workload, w in wide.groupby("workload"):
            ranked = w.dropna(subset=["publish_rate_msg_s"]).sort_values("publish_rate_msg_s", ascending=False)
            text = ", ".join(f"{r.plugin_set} ({flushes.get(r.plugin_set, '?')}) {_fmt(r.publish_rate_msg_s)} msg/s"
                             for r in ranked.itertuples())
            if text:
                found.append(f"{workload}: publish rate {text}")
    elif matrix.kind == "allocation" and not wide.empty:
        for metric, what in (("allocation_imbalance", "lowest mean imbalance"),
                             ("allocation_overload", "least overloaded busiest member"),
                             ("allocation_queues_moved_per_change", "fewest queues moved per membership change")):
            best = _best(wide, metric, lowest=True)
            if best:
                found.append(f"{what}: {best[0]} ({_fmt(best[1])})")
    elif matrix.kind == "filter" and {"filter_selectivity", "filter_scan_us_per_entry"} <= set(wide.columns):
        ranked = wide.sort_values(["filter_selectivity", "plugin_set"])
        for r in ranked.itertuples():
            found.append(f"{r.workload} / {r.plugin_set}: selectivity {_fmt(r.filter_selectivity)}, "
                         f"{_fmt(r.filter_scan_us_per_entry)} µs per entry, pre-check pass rate "
                         f"{_fmt(getattr(r, 'filter_precheck_pass_rate', float('nan')))}")
    else:
        best = _best(wide, "publish_rate_msg_s", lowest=False)
        if best:
            found.append(f"highest publish rate: {best[0]} ({_fmt(best[1])} msg/s)")
    return found


# ------------------------------------------------------------------------------------------ page
def write_report(out: Path, *, matrices: Sequence[Matrix], tables: dict[str, pd.DataFrame],
                 aggregated: dict[str, pd.DataFrame], sweep: dict[str, pd.DataFrame] | None,
                 run_info: dict[str, Any]) -> tuple[Path, list[str]]:
    """Write ``report.html`` and the charts into ``out``; returns the page and the findings."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    experiments = tables["experiments"]
    status = aggregated["status"]
    summary = aggregated["summary"]
    merged = aggregated["merged_histograms"]
    errors = {(r.workload, r.plugin_set): (r.error or "").strip().splitlines()[-1] if r.error else ""
              for r in experiments.itertuples() if r.status != "ok"}
    all_findings: list[str] = []
    parts = [(f"<!doctype html><html><head><meta charset=utf-8><title>plugmq compare</title><style>{_CSS}</style>"
              "</head><body><h1>plugmq plugin comparison</h1>")]
    parts.append(_run_block(run_info, experiments))
    for matrix in matrices:
        wide = _pivot(summary, matrix.name, COLUMNS[matrix.kind])
        findings = headline_findings(matrix, wide, status, errors, experiments)
        all_findings.extend(f"[{matrix.name}] {f}" for f in findings)
        parts.append(f"<h2>{html.escape(matrix.name)} <small>({matrix.kind})</small></h2>")
        parts.append(f"<p class=note>workloads: {', '.join(matrix.workloads)} · plugin sets: "
                     f"{', '.join(matrix.plugin_sets)} · repetitions: {matrix.repetitions}</p>")
        if findings:
            parts.append("<ul>" + "".join(f"<li>{f}</li>" for f in findings) + "</ul>")
        section_status = status[status["matrix"] == matrix.name].drop(columns=["matrix"])
        parts.append(_table(section_status.sort_values(["workload", "plugin_set"])))
        if not wide.empty:
            parts.append("<p class=note>Medians over repetitions; latency percentiles from the repetitions' merged "
                         "histograms (about 6 % bucket resolution), maxima over runs.</p>")
            parts.append(_table(wide))
        for chart in _charts(plt, matrix, wide, summary, merged, status, experiments, out):
            parts.append(f'<img src="{chart}" alt="{html.escape(chart)}">')
    if sweep:
        parts.append(_sweep_block(plt, sweep, out, all_findings))
    parts.append("</body></html>")
    page = out / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page, all_findings


def _charts(plt: Any, matrix: Matrix, wide: pd.DataFrame, summary: pd.DataFrame, merged: pd.DataFrame,
            status: pd.DataFrame, experiments: pd.DataFrame, out: Path) -> list[str]:
    name = matrix.name
    charts = []
    if matrix.kind == "delay" and _lateness_cdf(plt, merged, name, status, out / f"{name}_lateness_cdf.png"):
        charts.append(f"{name}_lateness_cdf.png")
    if matrix.kind == "storage" and _bars(plt, wide, [("publish_rate_msg_s", "publish rate (msg/s)"),
                                                      ("publish_latency_p99_ms", "publish latency p99 (ms)"),
                                                      ("end_to_end_latency_p99_ms", "end-to-end p99 (ms)")],
                                          "throughput and latency per store and flush mode",
                                          out / f"{name}_throughput.png", summary, name):
        charts.append(f"{name}_throughput.png")
    if matrix.kind == "allocation" and _bars(plt, wide, [("allocation_imbalance", "mean imbalance (max/min)"),
                                                         ("allocation_overload", "busiest member / fair share"),
                                                         ("allocation_queues_moved_per_change", "queues moved per change")],
                                             "allocation under consumer churn", out / f"{name}_allocation.png",
                                             summary, name):
        charts.append(f"{name}_allocation.png")
    if matrix.kind == "filter" and _filter_cost(plt, wide, experiments, name, out / f"{name}_filter_cost.png"):
        charts.append(f"{name}_filter_cost.png")
    if matrix.kind == "general" and _bars(plt, wide, [("publish_rate_msg_s", "publish rate (msg/s)"),
                                                      ("publish_latency_p99_ms", "publish latency p99 (ms)")],
                                          "throughput", out / f"{name}_throughput.png", summary, name):
        charts.append(f"{name}_throughput.png")
    return charts


def _sweep_block(plt: Any, sweep: dict[str, pd.DataFrame], out: Path, findings: list[str]) -> str:
    summary = sweep["summary"]
    parts = ["<h2>Allocation sweep <small>(every queues x consumers pair, Spark SQL)</small></h2>",
             f"<p class=note>{html.escape(str(sweep.get('note', '')))}</p>"]
    for row in summary.itertuples():
        text = (f"{row.strategy}: mean imbalance {_fmt(row.mean_imbalance)} (queues >= consumers), busiest member "
                f"{_fmt(row.mean_overload)} x its fair share on average, balanced "
                f"(max - min <= 1) in {_fmt(100 * row.share_balanced)} % of pairs, a join moves "
                f"{_fmt(row.mean_moved_over_ideal)} x the ideal number of queues on average")
        findings.append(f"[sweep] {text}")
        parts.append(f"<p>{text}</p>")
    parts.append(_table(summary))
    for chart in _sweep_charts(plt, sweep, out):
        parts.append(f'<img src="{chart}" alt="{chart}">')
    return "\n".join(parts)


def _run_block(run_info: dict[str, Any], experiments: pd.DataFrame) -> str:
    rows = list(run_info.items())
    if not experiments.empty:
        env_cols = [c for c in experiments.columns if c.startswith("env_") and c not in ("env_load_1m",)]
        first = experiments.iloc[0]
        rows.extend((c, first[c]) for c in env_cols)
        if "env_load_1m" in experiments:
            loads = experiments["env_load_1m"].dropna()
            if len(loads):
                rows.append(("load average (1 min) at experiment starts", f"{loads.min():.2f} – {loads.max():.2f}"))
        durability = experiments.groupby("plugin_set")["durability"].first()
        rows.extend((f"durability flags: {k}", v) for k, v in durability.items())
    body = "".join(f"<tr><td>{html.escape(str(k))}</td><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    return f"<table>{body}</table>"
