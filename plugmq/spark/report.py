"""``report.html`` and its PNG charts, findings first, numbers straight from the tables.

The page opens with the findings: the headline table (:mod:`plugmq.spark.headline`: who wins each
headline measure, by how much, and whether that beats the run-to-run spread) and notes
(unsupported or failed runs, early deliveries). Then one section per matrix with its charts and
its tables (medians over repetitions; latency percentiles from the merged histograms); then the
allocation sweep; the environment and every durability flag come last. Wide tables scroll inside
their box. Charts use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plugmq.kit.histogram import bucket_upper_ms
from plugmq.spark.experiments import Matrix
from plugmq.spark.headline import HeadlineRow, as_frame, headline_rows, sweep_headline_rows
from plugmq.spark.kinds import KINDS

__all__ = ["notes", "write_report"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0}.scroll table{margin:0}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td.wrap{white-space:normal;min-width:16em;text-align:left}
.win{font-weight:600}.flags td{text-align:left;white-space:normal}td,th{white-space:nowrap}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
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
    return f"<div class=scroll><table><tr>{head}</tr>{body}</table></div>"


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
        curves: list[tuple[str, np.ndarray | None, np.ndarray | None]] = []
        for plugin_set in sorted(rows["plugin_set"]):
            h = part[(part["workload"] == workload) & (part["plugin_set"] == plugin_set)].sort_values("bucket")
            if h.empty:
                flags = rows[rows["plugin_set"] == plugin_set].iloc[0]
                reason = "unsupported" if flags["unsupported"] else "failed" if flags["failed"] else "no data"
                curves.append((f"{plugin_set} ({reason})", None, None))
                continue
            edges = np.array([max(bucket_upper_ms(int(b)), floor) for b in h["bucket"]])
            fractions = np.cumsum(h["count"].to_numpy()) / h["count"].sum()
            curves.append((plugin_set, edges, fractions))
        right = max([float(c[1].max()) for c in curves if c[1] is not None] + [floor * 10]) * 1.5
        for label, x, y in curves:
            if x is None or y is None:
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
def notes(matrix: Matrix, wide: pd.DataFrame, status: pd.DataFrame, errors: dict[tuple[str, str], str]) -> list[str]:
    """What the headline table cannot say: unsupported and failed runs, invariants that must hold."""
    found = []
    part = status[status["matrix"] == matrix.name]
    for row in part[part["unsupported"] > 0].itertuples():
        reason = errors.get((row.workload, row.plugin_set), "")
        found.append(f"{row.plugin_set} on {row.workload}: <b>unsupported</b> — {html.escape(reason[:400])}")
    for row in part[part["failed"] > 0].itertuples():
        found.append(f"<span class=bad>{row.plugin_set} on {row.workload}: {row.failed} failed run(s)</span>")
    if matrix.kind == "delay" and "delay_early_deliveries" in wide:
        early = wide["delay_early_deliveries"].sum()
        found.append(f"early deliveries over all runs: {_fmt(early)}" + (" (must be 0)" if early else ""))
    for column in ("consume_missing", "consume_duplicates"):
        if column in wide and wide[column].fillna(0).sum() > 0:
            bad = wide[wide[column].fillna(0) > 0]
            found.append("<span class=bad>" + ", ".join(f"{r.plugin_set} on {r.workload}: {_fmt(getattr(r, column))}"
                                                         for r in bad.itertuples()) + f" {column}</span>")
    return found


def _headline_table(rows: Sequence[HeadlineRow]) -> str:
    head = ("<tr><th>comparison</th><th>scenario</th><th>measure</th><th>winner</th><th>value (range)</th>"
            "<th>runner-up</th><th>value (range)</th><th>by how much</th><th>run-to-run spread</th>"
            "<th>all, best first</th></tr>")
    body = []
    for r in rows:
        def rng(value: float | None, low: float | None, high: float | None, runs: int) -> str:
            if value is None:
                return "–"
            if runs > 1 and low is not None and high is not None and low != high:
                return f"{_fmt(value)} ({_fmt(low)}–{_fmt(high)})"
            return _fmt(value)

        unit = f" {html.escape(r.unit)}" if r.unit else ""
        ranking = "; ".join(f"{html.escape(name)} {_fmt(value)}" for name, value in r.ranking)
        body.append(
            f"<tr><td>{html.escape(r.comparison)}</td><td>{html.escape(r.scenario)}</td>"
            f"<td>{html.escape(r.measure)} <small>({r.better} is better)</small></td>"
            f"<td class=win>{html.escape(r.winner)}</td><td>{rng(r.value, r.low, r.high, r.runs)}{unit}</td>"
            f"<td>{html.escape(r.runner_up or '–')}</td>"
            f"<td>{rng(r.runner_up_value, r.runner_up_low, r.runner_up_high, r.runs)}{unit}</td>"
            f"<td>{html.escape(r.margin)}</td><td>{html.escape(r.spread)}</td><td class=wrap>{ranking}</td></tr>")
    return f"<div class=scroll><table class=headline>{head}{''.join(body)}</table></div>"


# ------------------------------------------------------------------------------------------ page
def write_report(out: Path, *, matrices: Sequence[Matrix], tables: dict[str, pd.DataFrame],
                 aggregated: dict[str, pd.DataFrame], sweep: dict[str, pd.DataFrame] | None,
                 run_info: dict[str, Any], sweep_note: str = "") -> tuple[Path, list[str]]:
    """Write ``report.html`` (findings, charts, environment), the charts and ``headline.parquet``
    into ``out``; returns the page and the findings as text lines."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    experiments = tables["experiments"]
    status = aggregated["status"]
    summary = aggregated["summary"]
    merged = aggregated["merged_histograms"]
    errors = {(r.workload, r.plugin_set): (r.error or "").strip().splitlines()[-1] if r.error else ""
              for r in experiments.itertuples() if r.status != "ok"}
    rows = headline_rows(matrices, summary, experiments)
    rows += sweep_headline_rows(sweep.get("summary") if sweep else None)
    as_frame(rows).to_parquet(out / "headline.parquet", index=False)
    wides = {m.name: _pivot(summary, m.name, KINDS[m.kind].columns) for m in matrices}
    all_notes = [f"[{m.name}] {n}" for m in matrices for n in notes(m, wides[m.name], status, errors)]
    counts = experiments["status"].value_counts().to_dict() if not experiments.empty else {}
    parts = [(f"<!doctype html><html><head><meta charset=utf-8><title>plugmq compare</title><style>{_CSS}</style>"
              "</head><body><h1>plugmq plugin comparison</h1>"),
             f"<p class=note>{len(experiments)} experiments ("
             + ", ".join(f"{n} {html.escape(str(k))}" for k, n in sorted(counts.items()))
             + f") on {html.escape(str(run_info.get('spark master', '?')))}; matrix wall time "
             f"{html.escape(str(run_info.get('matrix wall time (s)', '?')))} s. Environment and flags at the end.</p>",
             "<section id=findings><h2>Findings</h2>",
             "<p class=note>Per comparison and scenario, the plugin that wins each headline measure: medians over "
             "repetitions, with the range (min–max) over runs; a win is clear only when the two ranges do not "
             "overlap.</p>", _headline_table(rows) if rows else "<p>No measure had two contenders that finished.</p>"]
    if all_notes:
        parts.append("<ul>" + "".join(f"<li>{n}</li>" for n in all_notes) + "</ul>")
    parts.append("</section><section id=charts><h2>Charts and tables</h2>")
    for matrix in matrices:
        wide = wides[matrix.name]
        parts.append(f"<h3>{html.escape(matrix.name)} <small>({matrix.kind})</small></h3>")
        parts.append(f"<p class=note>workloads: {', '.join(matrix.workloads)} · plugin sets: "
                     f"{', '.join(matrix.plugin_sets)} · repetitions: {matrix.repetitions}</p>")
        for chart in _charts(plt, matrix, wide, summary, merged, status, experiments, out):
            parts.append(f'<img src="{chart}" alt="{html.escape(chart)}">')
        section_status = status[status["matrix"] == matrix.name].drop(columns=["matrix"])
        parts.append(_table(section_status.sort_values(["workload", "plugin_set"])))
        if not wide.empty:
            parts.append("<p class=note>Medians over repetitions; latency percentiles from the repetitions' merged "
                         "histograms (about 6 % bucket resolution), maxima over runs.</p>")
            parts.append(_table(wide))
    if sweep:
        parts.append(_sweep_block(plt, sweep, out, sweep_note))
    parts.append("</section><section id=environment><h2>Environment and flags</h2>")
    parts.append(_run_block(run_info, experiments))
    parts.append("</section></body></html>")
    page = out / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page, [r.text() for r in rows] + [_plain(n) for n in all_notes]


def _plain(text: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", text))


def _charts(plt: Any, matrix: Matrix, wide: pd.DataFrame, summary: pd.DataFrame, merged: pd.DataFrame,
            status: pd.DataFrame, experiments: pd.DataFrame, out: Path) -> list[str]:
    kind = KINDS[matrix.kind]
    name = matrix.name
    charts = []
    if "lateness_cdf" in kind.charts and _lateness_cdf(plt, merged, name, status, out / f"{name}_lateness_cdf.png"):
        charts.append(f"{name}_lateness_cdf.png")
    if "filter_cost" in kind.charts and _filter_cost(plt, wide, experiments, name, out / f"{name}_filter_cost.png"):
        charts.append(f"{name}_filter_cost.png")
    if kind.bars and _bars(plt, wide, kind.bars, kind.bars_title, out / f"{name}_{kind.name}.png", summary, name):
        charts.append(f"{name}_{kind.name}.png")
    return charts


def _sweep_block(plt: Any, sweep: dict[str, pd.DataFrame], out: Path, note: str) -> str:
    parts = ["<h3>Allocation sweep <small>(every queues x consumers pair, Spark SQL)</small></h3>",
             f"<p class=note>{html.escape(note)}</p>"]
    for chart in _sweep_charts(plt, sweep, out):
        parts.append(f'<img src="{chart}" alt="{chart}">')
    parts.append(_table(sweep["summary"]))
    return "\n".join(parts)


def _run_block(run_info: dict[str, Any], experiments: pd.DataFrame) -> str:
    rows: list[tuple[str, str]] = [(k, str(v)) for k, v in run_info.items()]
    flags: list[tuple[str, str]] = []
    if not experiments.empty:
        env_cols = [c for c in experiments.columns if c.startswith("env_") and c not in ("env_load_1m", "env_host")]
        first = experiments.iloc[0]
        rows.extend((c.removeprefix("env_"), str(first[c])) for c in env_cols)
        if "env_host" in experiments:
            rows.append(("hosts", ", ".join(sorted(map(str, experiments["env_host"].dropna().unique())))))
        if "env_load_1m" in experiments:
            loads = experiments["env_load_1m"].dropna()
            if len(loads):
                rows.append(("load average (1 min) at experiment starts", f"{loads.min():.2f} – {loads.max():.2f}"))
        for plugin_set, raw in experiments.groupby("plugin_set")["durability"].first().items():
            try:
                parsed = json.loads(raw) if isinstance(raw, str) else {}
            except ValueError:
                parsed = {"unreadable": raw}
            flags.append((str(plugin_set), ", ".join(f"{k} = {v}" for k, v in sorted(parsed.items())) or "–"))
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    flag_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in flags)
    return (f"<div class=scroll><table class=flags>{body}</table></div>"
            "<h3>Durability flags in force, per plugin set</h3>"
            f"<div class=scroll><table class=flags><tr><th>plugin set</th><th>flags</th></tr>{flag_rows}</table></div>")
