"""The headline table: for every comparison, scenario and headline measure, who wins and by how much,
and whether that is a finding at all.

Computed from the medians over repetitions (``summary``) and their run-to-run range (min-max),
never from a single run when there are several. A row is **headlined** only when it is a finding
a team can act on; otherwise it says why not (``why_not``), first reason that applies:

* **capped**: the winner's or the runner-up's value sits at a known wait or timeout
  (:mod:`plugmq.spark.caps`): it measured the wait, not the plugins; or it is only a lower bound
  (a failover round that never recovered counts as the time it was watched);
* **identical at a bound**: on the real clock, the top contenders read exactly the same non-zero
  value (one histogram bucket, a cap, a timeout), so neither was measured apart from the other;
* **a tie**;
* **about zero**: both values are below the measure's noise floor (:class:`~plugmq.spark.kinds.Measure`),
  where a ratio means nothing (a "1226.81x" of 0.001 ms against 1.23 ms);
* **below the noise floor**: the difference is smaller than the floor, or than the measure's
  relative resolution (a histogram bucket for percentiles, 5 % for timed rates and costs);
* **within the run-to-run spread**: the ranges over repetitions overlap.

With one run the spread is unknown; the row is headlined and says so. ``flags`` name every
contender (not only the top two) whose value sits at a cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pandas as pd

from plugmq.spark.caps import Cap, at_cap, caps_of, lower_bound
from plugmq.spark.experiments import Matrix
from plugmq.spark.kinds import KINDS, PERCENTILE, Kind, Measure

__all__ = ["Contender", "HeadlineRow", "headline_rows", "judge", "number_text", "sweep_headline_rows"]


@attrs.frozen
class Contender:
    """One plugin set's (or filter type's) figure for a measure: median, min-max over ``runs``."""

    label: str
    value: float
    low: float
    high: float
    runs: int = 1
    cap: Cap | None = None  # the known wait or timeout the value sits at
    measured: bool = True  # on the real clock (False: a deterministic figure of a virtual clock or a model)


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
    headlined: bool = True
    why_not: str = ""  # why the row is not headlined ("" when it is)
    flags: tuple[str, ...] = ()  # contenders whose values sit at a known cap

    def text(self) -> str:
        """One line for a terminal."""
        against = f" vs {self.runner_up} {number_text(self.runner_up_value)} {self.unit}" if self.runner_up else ""
        line = (f"[{self.comparison}] {self.scenario}: {self.measure} ({self.better} is better): {self.winner} "
                f"{number_text(self.value)} {self.unit}{against}")
        if not self.headlined:
            return f"{line} — not headlined: {self.why_not}"
        return f"{line} — {self.margin}; {self.spread}"


def number_text(value: float | None) -> str:
    """A figure as the report prints it: thousands separated, 2-3 significant decimals, "–" for none."""
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


def _amount(measure: Measure, value: float) -> str:
    unit = f" {measure.unit}" if measure.unit and measure.unit != "x" else ""
    return f"{number_text(value)}{unit}"


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
    """How much better the winner is than the runner-up: the difference, and a factor when both
    values are above the noise floor (a ratio of two figures about zero means nothing)."""
    diff = abs(second - best)
    if diff == 0:
        return "tie"
    word = "less" if measure.better == "lower" else "more"
    if min(best, second) > 0 and min(best, second) >= measure.floor:
        factor = second / best if measure.better == "lower" else best / second
        return f"{factor:.2f}x ({_amount(measure, diff)} {word})"
    return f"{_amount(measure, diff)} {word}"


def spread_text(runs: int, low: float, high: float, second_low: float | None, second_high: float | None) -> str:
    if runs <= 1:
        return "1 run: spread not measured"
    if second_low is None or second_high is None:
        return f"{runs} runs, range {number_text(low)}–{number_text(high)}"
    if low == high and second_low == second_high:
        return f"identical in all {runs} runs"
    if high < second_low or low > second_high:
        return f"clear: the {runs} runs' ranges do not overlap"
    return f"within the run-to-run spread ({runs} runs): not a clear win"


def _noise(measure: Measure, best: Contender, second: Contender) -> str:
    """Why the difference of the top two is noise, or ""."""
    diff = abs(second.value - best.value)
    if max(abs(best.value), abs(second.value)) < measure.floor:
        return (f"about zero: both below the noise floor of {_amount(measure, measure.floor)} "
                f"({best.label} {_amount(measure, best.value)}, {second.label} {_amount(measure, second.value)}), "
                "where no ratio means anything")
    if diff < measure.floor:
        return f"the difference, {_amount(measure, diff)}, is below the noise floor of {_amount(measure, measure.floor)}"
    low = min(abs(best.value), abs(second.value))
    if measure.resolution and low > 0 and diff / low < measure.resolution:
        what = ("one histogram bucket" if measure.resolution == PERCENTILE
                else "what a timed figure moves between runs on a shared host")
        return f"{diff / low:.1%} apart, within the {measure.resolution:.0%} the measurement resolves ({what})"
    runs = min(best.runs, second.runs)
    if runs > 1 and not (best.high < second.low or best.low > second.high):
        return f"within the run-to-run spread: the {runs} runs' ranges overlap"
    return ""


def judge(measure: Measure, ranked: Sequence[Contender]) -> tuple[str, tuple[str, ...]]:
    """Why the row of ``ranked`` (best first, at least two) is not headlined ("" when it is), and
    the flags of contenders at a cap."""
    flags = tuple(f"{c.label}: {_amount(measure, c.value)} {c.cap.verb} {c.cap.text()}" for c in ranked if c.cap)
    best, second = ranked[0], ranked[1]
    capped = [(c, c.cap) for c in (best, second) if c.cap is not None]
    if capped:
        said = [f"{c.label}'s {_amount(measure, c.value)} {cap.verb} {cap.text()}" for c, cap in capped]
        meanings = dict.fromkeys(cap.meaning for _, cap in capped)
        return "capped: " + "; ".join(said) + " — " + "; ".join(meanings), flags
    same = [c for c in ranked if c.value == best.value]
    if len(same) > 1 and best.value != 0 and all(c.measured for c in same):
        return (f"identical at a bound: {', '.join(c.label for c in same)} all read exactly "
                f"{_amount(measure, best.value)} on the real clock (one histogram bucket, a cap or a timeout), "
                "so none was measured apart from the others", flags)
    if best.value == second.value:
        return f"a tie: {best.label} and {second.label} both {_amount(measure, best.value)}", flags
    return _noise(measure, best, second), flags


def _rank(measure: Measure, candidates: list[Contender]) -> list[Contender]:
    return sorted(candidates, key=lambda c: (c.value if measure.better == "lower" else -c.value, c.label))


def _row(comparison: str, scenario: str, measure: Measure, candidates: list[Contender]) -> HeadlineRow:
    ranked = _rank(measure, candidates)
    best, second = ranked[0], ranked[1]
    why_not, flags = judge(measure, ranked)
    return HeadlineRow(
        comparison=comparison, scenario=scenario, measure=measure.label, better=measure.better, unit=measure.unit,
        winner=best.label, value=best.value, low=best.low, high=best.high, runs=best.runs,
        runner_up=second.label, runner_up_value=second.value, runner_up_low=second.low, runner_up_high=second.high,
        margin=margin_text(measure, best.value, second.value),
        spread=spread_text(min(best.runs, second.runs), best.low, best.high, second.low, second.high),
        ranking=tuple((c.label, c.value) for c in ranked), headlined=not why_not, why_not=why_not, flags=flags)


def _contender(label: str, row: Mapping[str, Any], metric: str, caps: tuple[Cap, ...], measured: bool,
               unmet: float = 0.0) -> Contender:
    value = float(row["value"])
    low = float(row["low"]) if not pd.isna(row["low"]) else value
    high = float(row["high"]) if not pd.isna(row["high"]) else value
    runs = int(row["runs"]) if not pd.isna(row["runs"]) else 1
    cap = lower_bound(metric, value, unmet) if unmet > 0 else at_cap(metric, value, caps)
    return Contender(label, value, low, high, runs, cap, measured)


def _unmet(measure: Measure, figures: Mapping[tuple[str, str, str], Mapping[str, Any]], key: tuple[str, str]) -> float:
    """The value of the measure's ``bound_by`` count (0 when it has none)."""
    row = figures.get((*key, measure.bound_by)) if measure.bound_by else None
    return 0.0 if row is None or pd.isna(row["value"]) else float(row["value"])


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
        scenarios: dict[str, list[tuple[str, tuple[str, str], tuple[Cap, ...], bool]]] = {}
        for workload, plugin_set in sorted(set(zip(part["workload"], part["plugin_set"], strict=True))):
            meta = info.loc[(workload, plugin_set)] if (workload, plugin_set) in info.index else pd.Series(dtype=object)
            scenarios.setdefault(_scenario(kind, meta, workload), []).append(
                (_label(kind, meta, plugin_set, many_sets), (workload, plugin_set), caps_of(meta),
                 meta.get("clock") == "real"))
        figures = {(r["workload"], r["plugin_set"], r["metric"]): r for r in part.to_dict("records")}
        for scenario, contenders in scenarios.items():
            for measure in kind.headline:
                candidates = [_contender(label, figures[(*key, measure.metric)], measure.metric, caps, measured,
                                         _unmet(measure, figures, key))
                              for label, key, caps, measured in contenders
                              if (*key, measure.metric) in figures and not pd.isna(figures[(*key, measure.metric)]["value"])]
                if len(candidates) >= 2:  # else nothing to compare (the others failed or were unsupported: see the notes)
                    rows.append(_row(matrix.name, scenario, measure, candidates))
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
        candidates = [Contender(str(r["strategy"]), float(r[measure.metric]), float(r[measure.metric]),
                                float(r[measure.metric]), measured=False)
                      for _, r in summary.iterrows() if not pd.isna(r[measure.metric])]
        if len(candidates) < 2:
            continue
        row = _row("allocation sweep", note or "every (queues, consumers) pair", measure, candidates)
        rows.append(attrs.evolve(row, spread="exact (computed, not measured)"))
    return rows


def as_frame(rows: Sequence[HeadlineRow]) -> pd.DataFrame:
    """The rows as a table (for Parquet and tests)."""
    records: list[dict[str, Any]] = []
    for row in rows:
        record = attrs.asdict(row)
        record["ranking"] = "; ".join(f"{name} {number_text(value)}" for name, value in row.ranking)
        record["flags"] = "; ".join(row.flags)
        records.append(record)
    return pd.DataFrame.from_records(records, columns=[f.name for f in attrs.fields(HeadlineRow)])
