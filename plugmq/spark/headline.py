"""The headline table: for every comparison, scenario and headline measure, who wins and by how much.

Computed from the medians over repetitions (``summary``) and their run-to-run range (min-max),
never from a single run when there are several. A win is "clear" only when the winner's range and
the runner-up's do not overlap; with one run the spread is unknown and the row says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import pandas as pd

from plugmq.spark.experiments import Matrix
from plugmq.spark.kinds import KINDS, Kind, Measure

__all__ = ["HeadlineRow", "headline_rows", "sweep_headline_rows"]


@attrs.frozen
class HeadlineRow:
    comparison: str
    scenario: str
    measure: str
    better: str
    unit: str
    winner: str
    value: float
    low: float
    high: float
    runs: int
    runner_up: str | None
    runner_up_value: float | None
    runner_up_low: float | None
    runner_up_high: float | None
    margin: str
    spread: str
    ranking: tuple[tuple[str, float], ...]

    def text(self) -> str:
        """One line for a terminal."""
        against = f" vs {self.runner_up} {_num(self.runner_up_value)} {self.unit}" if self.runner_up else ""
        return (f"[{self.comparison}] {self.scenario}: {self.measure} ({self.better} is better): {self.winner} "
                f"{_num(self.value)} {self.unit}{against} — {self.margin}; {self.spread}")


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    v = float(value)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _label(kind: Kind, info: pd.Series, plugin_set: str, many_sets: bool) -> str:
    value = info.get(kind.contender) if kind.contender in info else None
    if kind.contender == "plugin_set" or value is None or (isinstance(value, float) and math.isnan(value)):
        return plugin_set
    return f"{value} / {plugin_set}" if many_sets else str(value)


def _scenario(kind: Kind, info: pd.Series, workload: str) -> str:
    if kind.scenario == "workload":
        return workload
    value = info.get(kind.scenario)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return workload
    name = kind.scenario.removesuffix("_target").replace("filter_", "").replace("_", " ")
    return f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"


def margin_text(measure: Measure, best: float, second: float) -> str:
    """How much better the winner is than the runner-up: a factor when both are positive, and the difference."""
    diff = abs(second - best)
    if diff == 0:
        return "tie"
    unit = f" {measure.unit}" if measure.unit and measure.unit != "x" else ""
    word = "less" if measure.better == "lower" else "more"
    if best > 0 and second > 0:
        factor = second / best if measure.better == "lower" else best / second
        return f"{factor:.2f}x ({_num(diff)}{unit} {word})"
    return f"{_num(diff)}{unit} {word}"


def spread_text(runs: int, low: float, high: float, second_low: float | None, second_high: float | None) -> str:
    if runs <= 1:
        return "1 run: spread not measured"
    if second_low is None or second_high is None:
        return f"{runs} runs, range {_num(low)}–{_num(high)}"
    if low == high and second_low == second_high:
        return f"identical in all {runs} runs"
    if high < second_low or low > second_high:
        return f"clear: the {runs} runs' ranges do not overlap"
    return f"within the run-to-run spread ({runs} runs): not a clear win"


def _rank(measure: Measure, candidates: list[tuple[str, float, float, float, int]]) -> list[tuple[str, float, float, float, int]]:
    return sorted(candidates, key=lambda c: (c[1] if measure.better == "lower" else -c[1], c[0]))


def headline_rows(matrices: Sequence[Matrix], summary: pd.DataFrame, experiments: pd.DataFrame) -> list[HeadlineRow]:
    """The winner of every headline measure in every scenario of every matrix (ok runs only)."""
    rows: list[HeadlineRow] = []
    for matrix in matrices:
        kind = KINDS[matrix.kind]
        part = summary[summary["matrix"] == matrix.name]
        if part.empty:
            continue
        info = experiments[experiments["matrix"] == matrix.name].groupby(["workload", "plugin_set"]).first()
        many_sets = len(set(part["plugin_set"])) > 1
        scenarios: dict[str, list[tuple[str, tuple[str, str]]]] = {}
        for workload, plugin_set in sorted(set(zip(part["workload"], part["plugin_set"], strict=True))):
            meta = info.loc[(workload, plugin_set)] if (workload, plugin_set) in info.index else pd.Series(dtype=object)
            scenarios.setdefault(_scenario(kind, meta, workload), []).append(
                (_label(kind, meta, plugin_set, many_sets), (workload, plugin_set)))
        figures = {(r["workload"], r["plugin_set"], r["metric"]): r for r in part.to_dict("records")}
        for scenario, contenders in scenarios.items():
            for measure in kind.headline:
                candidates = []
                for label, (workload, plugin_set) in contenders:
                    row = figures.get((workload, plugin_set, measure.metric))
                    if row is None or pd.isna(row["value"]):
                        continue
                    value = float(row["value"])
                    low = float(row["low"]) if not pd.isna(row["low"]) else value
                    high = float(row["high"]) if not pd.isna(row["high"]) else value
                    runs = int(row["runs"]) if not pd.isna(row["runs"]) else 1
                    candidates.append((label, value, low, high, runs))
                if len(candidates) < 2:
                    continue  # nothing to compare (the others failed or were unsupported: see the notes)
                ranked = _rank(measure, candidates)
                (name, value, low, high, runs), second = ranked[0], ranked[1]
                rows.append(HeadlineRow(
                    comparison=matrix.name, scenario=scenario, measure=measure.label, better=measure.better,
                    unit=measure.unit, winner=name, value=value, low=low, high=high, runs=runs,
                    runner_up=second[0], runner_up_value=second[1], runner_up_low=second[2], runner_up_high=second[3],
                    margin=margin_text(measure, value, second[1]),
                    spread=spread_text(min(runs, second[4]), low, high, second[2], second[3]),
                    ranking=tuple((c[0], c[1]) for c in ranked)))
    return rows


_SWEEP_MEASURES = (Measure("mean_imbalance", "mean imbalance (queues >= consumers)", "lower", "x"),
                   Measure("mean_overload", "busiest member / fair share", "lower", "x"),
                   Measure("mean_moved_over_ideal", "queues moved on a join / ideal", "lower", "x"))


def sweep_headline_rows(summary: pd.DataFrame | None, note: str = "") -> list[HeadlineRow]:
    """Winners of the allocation sweep (a deterministic model: no spread)."""
    rows: list[HeadlineRow] = []
    if summary is None or summary.empty:
        return rows
    for measure in _SWEEP_MEASURES:
        candidates: list[tuple[str, float, float, float, int]] = [
            (str(r["strategy"]), float(r[measure.metric]), float(r[measure.metric]), float(r[measure.metric]), 1)
            for _, r in summary.iterrows() if not pd.isna(r[measure.metric])]
        if len(candidates) < 2:
            continue
        ranked = _rank(measure, candidates)
        best, second = ranked[0], ranked[1]
        rows.append(HeadlineRow(
            comparison="allocation sweep", scenario=note or "every (queues, consumers) pair", measure=measure.label,
            better=measure.better, unit=measure.unit, winner=best[0], value=best[1], low=best[1], high=best[1], runs=1,
            runner_up=second[0], runner_up_value=second[1], runner_up_low=second[1], runner_up_high=second[1],
            margin=margin_text(measure, best[1], second[1]), spread="exact (computed, not measured)",
            ranking=tuple((c[0], c[1]) for c in ranked)))
    return rows


def as_frame(rows: Sequence[HeadlineRow]) -> pd.DataFrame:
    """The rows as a table (for Parquet and tests)."""
    records: list[dict[str, Any]] = []
    for row in rows:
        record = attrs.asdict(row)
        record["ranking"] = "; ".join(f"{name} {_num(value)}" for name, value in row.ranking)
        records.append(record)
    return pd.DataFrame.from_records(records, columns=[f.name for f in attrs.fields(HeadlineRow)])
