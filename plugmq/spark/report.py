"""``report.html`` and its PNG charts, findings first, numbers straight from the tables.

The page opens with the findings (:mod:`plugmq.spark.findings`): the headlined rows (who wins each
headline measure, by how much, and whether that beats the run-to-run spread), the rows not
headlined with the reason (noise, about zero, a tie, a cap: :mod:`plugmq.spark.headline`), the
values at a known cap, and notes (unsupported or failed runs, early deliveries, losses). Then one
section per matrix with its charts (:mod:`plugmq.spark.charts`) and its tables (medians over
repetitions; latency percentiles from the merged histograms); then the allocation sweep; the
environment and every durability flag come last. The findings fit a 1280 px page; the wide
tables of figures further down scroll inside their box.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from plugmq.spark import charts
from plugmq.spark.caps import Cap, caps_of
from plugmq.spark.experiments import Matrix
from plugmq.spark.findings import CSS as FINDINGS_CSS
from plugmq.spark.findings import findings_html, fmt
from plugmq.spark.headline import as_frame, headline_rows, sweep_headline_rows
from plugmq.spark.kinds import KINDS

__all__ = ["notes", "write_report"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0}.scroll table{margin:0}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td.wrap{white-space:normal;min-width:16em;text-align:left}
.win{font-weight:600}.flags td{text-align:left;white-space:normal}td,th{white-space:nowrap}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f2f2f2}td:first-child,td:nth-child(2){text-align:left}.bad{color:#b00}.note{color:#555;font-size:13px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}h2{border-bottom:2px solid #446;padding-bottom:.2em;margin-top:2em}
li{margin:.2em 0}code{background:#f5f5f5;padding:0 3px}""" + FINDINGS_CSS


def _table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>" for row in frame.itertuples(index=False))
    return f"<div class=scroll><table><tr>{head}</tr>{body}</table></div>"


def _pivot(summary: pd.DataFrame, matrix: str, columns: Sequence[str]) -> pd.DataFrame:
    part = summary[summary["matrix"] == matrix]
    if part.empty:
        return pd.DataFrame()
    wide = part.pivot_table(index=["workload", "plugin_set"], columns="metric", values="value", aggfunc="first")
    present = [c for c in columns if c in wide.columns]
    return wide[present].reset_index()


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
        found.append(f"early deliveries over all runs: {fmt(early)}" + (" (must be 0)" if early else ""))
    # Broken promises: an acknowledged message lost, or delivered again after its OK ack.
    for column in ("consume_missing", "consume_duplicates", "chaos_lost_acked", "chaos_redelivered_after_ack"):
        if column in wide and wide[column].fillna(0).sum() > 0:
            bad = wide[wide[column].fillna(0) > 0]
            found.append("<span class=bad>" + ", ".join(f"{r.plugin_set} on {r.workload}: {fmt(getattr(r, column))}"
                                                         for r in bad.itertuples()) + f" {column}</span>")
    return found


# ------------------------------------------------------------------------------------------ page
def write_report(out: Path, *, matrices: Sequence[Matrix], tables: dict[str, pd.DataFrame],
                 aggregated: dict[str, pd.DataFrame], sweep: dict[str, pd.DataFrame] | None,
                 run_info: dict[str, Any], sweep_note: str = "") -> tuple[Path, list[str]]:
    """Write ``report.html`` (findings, charts, environment), the charts and ``headline.parquet``
    into ``out``; returns the page and the findings as text lines."""
    plt = charts.pyplot()
    looks = charts.Looks()
    out.mkdir(parents=True, exist_ok=True)
    experiments = tables["experiments"]
    status = aggregated["status"]
    summary = aggregated["summary"]
    errors = {(r.workload, r.plugin_set): (r.error or "").strip().splitlines()[-1] if r.error else ""
              for r in experiments.itertuples() if r.status != "ok"}
    rows = headline_rows(matrices, summary, experiments)
    rows += sweep_headline_rows(sweep.get("summary") if sweep else None)
    as_frame(rows).to_parquet(out / "headline.parquet", index=False)
    wides = {m.name: _pivot(summary, m.name, KINDS[m.kind].columns) for m in matrices}
    all_notes = [f"[{m.name}] {n}" for m in matrices for n in notes(m, wides[m.name], status, errors)]
    parts = [_head(experiments, run_info), "<section id=findings><h2>Findings</h2>", findings_html(rows, all_notes),
             "</section><section id=charts><h2>Charts and tables</h2>"]
    caps = _caps(experiments)
    for matrix in matrices:
        parts += _matrix_block(plt, looks, matrix, wides[matrix.name], aggregated, experiments, caps, out)
    if sweep:
        parts.append(_sweep_block(plt, looks, sweep, out, sweep_note))
    parts.append("</section><section id=environment><h2>Environment and flags</h2>")
    parts.append(_run_block(run_info, experiments))
    parts.append("</section></body></html>")
    page = out / "report.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    ordered = [r for r in rows if r.headlined] + [r for r in rows if not r.headlined]
    return page, [r.text() for r in ordered] + [_plain(n) for n in all_notes]


def _head(experiments: pd.DataFrame, run_info: dict[str, Any]) -> str:
    """The page's head and its first line: how many experiments ended how, where, how long."""
    counts = experiments["status"].value_counts().to_dict() if not experiments.empty else {}
    return (f"<!doctype html><html><head><meta charset=utf-8><title>plugmq compare</title><style>{_CSS}</style>"
            "</head><body><h1>plugmq plugin comparison</h1>"
            f"<p class=note>{len(experiments)} experiments ("
            + ", ".join(f"{n} {html.escape(str(k))}" for k, n in sorted(counts.items()))
            + f") on {html.escape(str(run_info.get('spark master', '?')))}; matrix wall time "
            f"{html.escape(str(run_info.get('matrix wall time (s)', '?')))} s. Environment and flags at the end.</p>")


def _matrix_block(plt: Any, looks: charts.Looks, matrix: Matrix, wide: pd.DataFrame,
                  aggregated: dict[str, pd.DataFrame], experiments: pd.DataFrame,
                  caps: dict[tuple[str, str, str], tuple[Cap, ...]], out: Path) -> list[str]:
    """One matrix's section: its charts, its status table and its medians."""
    parts = [f"<h3>{html.escape(matrix.name)} <small>({matrix.kind})</small></h3>",
             f"<p class=note>workloads: {', '.join(matrix.workloads)} · plugin sets: "
             f"{', '.join(matrix.plugin_sets)} · repetitions: {matrix.repetitions}</p>"]
    for chart in _charts(plt, looks, matrix, wide, aggregated, experiments, caps, out):
        parts.append(f'<img src="{chart}" alt="{html.escape(chart)}">')
    status = aggregated["status"]
    section_status = status[status["matrix"] == matrix.name].drop(columns=["matrix"])
    parts.append(_table(section_status.sort_values(["workload", "plugin_set"])))
    if not wide.empty:
        parts.append("<p class=note>Medians over repetitions; latency percentiles from the repetitions' merged "
                     "histograms (about 6 % bucket resolution), maxima over runs.</p>")
        parts.append(_table(wide))
    return parts


def _plain(text: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", text))


def _caps(experiments: pd.DataFrame) -> dict[tuple[str, str, str], tuple[Cap, ...]]:
    """The known caps of every (matrix, workload, plugin set), from its first experiment."""
    if experiments.empty:
        return {}
    first = experiments.groupby(["matrix", "workload", "plugin_set"]).first()
    return {key: caps_of(row) for key, row in first.iterrows()}


def _charts(plt: Any, looks: charts.Looks, matrix: Matrix, wide: pd.DataFrame, aggregated: dict[str, pd.DataFrame],
            experiments: pd.DataFrame, caps: dict[tuple[str, str, str], tuple[Cap, ...]], out: Path) -> list[str]:
    kind = KINDS[matrix.kind]
    name = matrix.name
    made = []
    status, summary = aggregated["status"], aggregated["summary"]
    if "lateness_cdf" in kind.charts and charts.lateness_cdf(plt, aggregated["merged_histograms"], name, status,
                                                             out / f"{name}_lateness_cdf.png", looks):
        made.append(f"{name}_lateness_cdf.png")
    if "filter_cost" in kind.charts and charts.filter_cost(plt, wide, experiments, name, out / f"{name}_filter_cost.png",
                                                           looks):
        made.append(f"{name}_filter_cost.png")
    mine = {(w, p): c for (m, w, p), c in caps.items() if m == name}
    if kind.bars and charts.bars(plt, wide, kind.bars, kind.bars_title, out / f"{name}_{kind.name}.png", looks,
                                 summary, name, mine):
        made.append(f"{name}_{kind.name}.png")
    return made


def _sweep_block(plt: Any, looks: charts.Looks, sweep: dict[str, pd.DataFrame], out: Path, note: str) -> str:
    parts = ["<h3>Allocation sweep <small>(every queues x consumers pair, Spark SQL)</small></h3>",
             f"<p class=note>{html.escape(note)}</p>"]
    for chart in charts.sweep_charts(plt, sweep, out, looks):
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
