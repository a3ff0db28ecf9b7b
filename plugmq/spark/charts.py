"""The report's PNG charts (matplotlib, Agg backend: no display needed), each line told apart.

Every contender keeps one look across the charts of a report (:class:`Looks`): a colour of the
Okabe-Ito palette (distinguishable with the common colour-vision deficiencies), a line style and a
marker, so a chart read in grey or by a colour-blind reader still tells them apart. Lines that
coincide (three lateness CDFs all at 0 ms) are drawn widest first and narrower on top, each with
its own dashes and marker, and the legend says which equals which: none hides another. A bar at a
known cap (:mod:`plugmq.spark.caps`) is hatched and labelled "cap".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plugmq.kit.histogram import bucket_upper_ms
from plugmq.spark.caps import Cap, at_cap

__all__ = ["OKABE_ITO", "Looks", "bars", "filter_cost", "lateness_cdf", "pyplot", "sweep_charts"]

# Okabe & Ito (2008), "Color Universal Design": black first is left out (it is the axes' colour).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
_DASHES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_HATCHES = ("", "//", "..", "\\\\", "++", "oo", "--", "**")


def pyplot() -> Any:
    """matplotlib.pyplot, imported on first use with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


class Looks:
    """One colour, dash, marker and hatch per name, the same in every chart that uses this object."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}

    def index(self, name: str) -> int:
        return self._index.setdefault(name, len(self._index))

    def line(self, name: str) -> dict[str, Any]:
        i = self.index(name)
        return {"color": OKABE_ITO[i % len(OKABE_ITO)], "linestyle": _DASHES[i % len(_DASHES)],
                "marker": _MARKERS[i % len(_MARKERS)]}

    def bar(self, name: str) -> dict[str, Any]:
        i = self.index(name)
        return {"color": OKABE_ITO[i % len(OKABE_ITO)], "hatch": _HATCHES[i % len(_HATCHES)], "edgecolor": "#333333"}


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _steps(ax: Any, curves: Sequence[tuple[str, np.ndarray | None, np.ndarray | None]], looks: Looks) -> None:
    """Draw ``curves`` as steps so that coinciding ones all stay visible: widest first, each narrower one on
    top with its own dashes and marker; the legend names the curve each one equals."""
    seen: list[tuple[str, np.ndarray, np.ndarray]] = []
    count = sum(1 for _, x, _ in curves if x is not None)
    for label, x, y in curves:
        if x is None or y is None:
            ax.plot([], [], label=label, color="#999999", linestyle=":")
            continue
        same = next((name for name, sx, sy in seen if np.array_equal(sx, x) and np.array_equal(sy, y)), None)
        width = 1.2 + 2.0 * (count - 1 - len(seen))
        ax.step(x, y, where="post", label=label if same is None else f"{label} (same as {same})", linewidth=width,
             markevery=(len(seen) % 3, 3), markersize=3 + width, zorder=2 + len(seen), **looks.line(label))
        seen.append((label, x, y))


# ------------------------------------------------------------------------------------------ lateness
def lateness_cdf(plt: Any, merged: pd.DataFrame, matrix: str, status: pd.DataFrame, path: Path,
                 looks: Looks) -> bool:
    """Per workload, the CDF of delayed messages' lateness, one curve per plugin set."""
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
        # From (floor, 0) through every bucket edge, flat to the right edge: a curve whose mass is
        # all at lateness 0 still shows as a step at the left.
        padded = [(label, None if x is None else np.concatenate([[floor], x, [right]]),
                   None if y is None else np.concatenate([[0.0], y, [1.0]])) for label, x, y in curves]
        _steps(ax, padded, looks)
        ax.set_xscale("log")
        ax.set_xlabel("lateness (ms, log; <=0 plotted at 0.001)")
        ax.set_ylabel("fraction of delayed messages")
        ax.set_title(f"{workload}: lateness CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(plt, fig, path)
    return True


# ------------------------------------------------------------------------------------------ bars
def _ranges(summary: pd.DataFrame, matrix: str, metric: str, keys: Sequence[tuple[str, str]]) -> tuple[Any, Any]:
    part = summary[(summary["matrix"] == matrix) & (summary["metric"] == metric)].set_index(["workload", "plugin_set"])
    low = np.array([part["low"].get(k, np.nan) for k in keys], dtype=float)
    high = np.array([part["high"].get(k, np.nan) for k in keys], dtype=float)
    return low, high


def bars(plt: Any, wide: pd.DataFrame, metrics: Sequence[tuple[str, str]], title: str, path: Path, looks: Looks,
         summary: pd.DataFrame | None = None, matrix: str | None = None,
         caps: Mapping[tuple[str, str], tuple[Cap, ...]] | None = None) -> bool:
    """One panel per metric: a bar per (workload, plugin set) with its min-max over runs; a bar at
    a known cap is hatched and labelled."""
    metrics = [(m, label) for m, label in metrics if m in wide.columns]
    if wide.empty or not metrics:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    keys = list(zip(wide["workload"], wide["plugin_set"], strict=True))
    labels = [f"{w}\n{p}" for w, p in keys]
    for ax, (metric, label) in zip(axes[0], metrics, strict=True):
        values = wide[metric].astype(float).to_numpy()
        errors = None
        if summary is not None and matrix is not None:
            low, high = _ranges(summary, matrix, metric, keys)
            if not np.all(np.isnan(low)):
                errors = np.nan_to_num(np.vstack([np.clip(values - low, 0, None), np.clip(high - values, 0, None)]))
        shown = np.nan_to_num(values)
        for i, ((_, plugin_set), value) in enumerate(zip(keys, shown, strict=True)):
            capped = at_cap(metric, float(value), (caps or {}).get(keys[i], ()))
            look = looks.bar(plugin_set)
            if capped is not None:
                look = {**look, "hatch": "xx"}
                ax.annotate("cap", (i, value), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
            ax.bar(i, value, yerr=None if errors is None else errors[:, i:i + 1], capsize=3, **look)
        ax.set_xticks(range(len(values)), labels, rotation=45, ha="right", fontsize=7)
        ax.margins(y=0.1)  # room for a "cap" label over the tallest bar
        if shown.min() >= 0:
            ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9))  # all zero: an axis from 0 up, not around it
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    _save(plt, fig, path)
    return True


# ------------------------------------------------------------------------------------------ filters
def filter_cost(plt: Any, wide: pd.DataFrame, experiments: pd.DataFrame, matrix: str, path: Path,
                looks: Looks) -> bool:
    """CPU per entry scanned and the pre-check pass rate against the measured selectivity."""
    needed = {"filter_selectivity", "filter_scan_us_per_entry", "filter_precheck_pass_rate"}
    if wide.empty or not needed <= set(wide.columns):
        return False
    types = experiments[experiments["matrix"] == matrix].groupby(["workload", "plugin_set"])["filter_type"].first()
    wide = wide.assign(filter_type=[types.get((w, p)) for w, p in zip(wide["workload"], wide["plugin_set"], strict=True)])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for (ftype, plugin_set), part in wide.groupby(["filter_type", "plugin_set"]):
        part = part.sort_values("filter_selectivity")
        label = f"{ftype} / {plugin_set}"
        axes[0].plot(part["filter_selectivity"], part["filter_scan_us_per_entry"], label=label, **looks.line(label))
        axes[1].plot(part["filter_selectivity"], part["filter_precheck_pass_rate"], label=label, **looks.line(label))
    axes[0].set_ylabel("CPU µs per consume-queue entry scanned")
    axes[1].set_ylabel("broker pre-check pass rate")
    for ax in axes:
        ax.set_xlabel("selectivity (measured fraction matching)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("filter cost vs selectivity")
    _save(plt, fig, path)
    return True


# ------------------------------------------------------------------------------------------ sweep
def sweep_charts(plt: Any, sweep: dict[str, pd.DataFrame], out: Path, looks: Looks) -> list[str]:
    """The allocation sweep: the busiest member and the churn of a join per consumer count, and
    the fraction moved on a join over every (queues, consumers) pair."""
    names = []
    by_c = sweep.get("by_consumers")
    if by_c is not None and not by_c.empty:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for strategy, part in by_c.groupby("strategy"):
            look = {**looks.line(str(strategy)), "markevery": max(1, len(part) // 12)}
            axes[0].plot(part["consumers"], part["mean_overload"], label=strategy, **look)
            axes[1].plot(part["consumers"], part["mean_moved_over_ideal"], label=strategy, **look)
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
        _save(plt, fig, out / "sweep_by_consumers.png")
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
        _save(plt, fig, out / "sweep_moved_heatmap.png")
        names.append("sweep_moved_heatmap.png")
    return names
