"""The Findings section of ``report.html``: what is headlined, what is not and why, what is capped.

Two tables that fit the page (1280 px wide and up, no horizontal scroll): the **headlined** rows
(winner, runner-up, by how much, the run-to-run spread, the rest of the field) and the rows **not
headlined**, each with its reason (:func:`plugmq.spark.headline.judge`). Cells wrap; the columns
share the width through fixed proportions. Values at a known cap carry a "cap" mark, and every
capped value is listed under the tables with the wait or timeout it sits at.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from plugmq.spark.headline import HeadlineRow, number_text

__all__ = ["CSS", "findings_html", "fmt"]

CSS = """table.headline,table.quiet{width:100%;table-layout:fixed}
.headline td,.headline th,.quiet td,.quiet th{white-space:normal;overflow-wrap:break-word;text-align:left;vertical-align:top}
.headline small,.quiet small{color:#555}.headline .num,.quiet .num{white-space:nowrap}
.cap{background:#fde8c8;border:1px solid #c80;border-radius:3px;padding:0 3px;font-size:11px;color:#840}
.why{color:#444}"""


def fmt(value: Any) -> str:
    """A number as the report prints it (thousands separated, 2-3 significant decimals), or text escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        return number_text(float(value))
    return html.escape(str(value))


def _name(name: str) -> str:
    """An identifier that may break only after ``_``, ``-``, ``/`` or ``.`` (never mid-word)."""
    return re.sub(r"([_\-/.])", r"\1<wbr>", html.escape(name))


def _capped(row: HeadlineRow, name: str | None) -> str:
    if name is None:
        return ""
    flag = next((f for f in row.flags if f.startswith(f"{name}: ")), None)
    return f' <span class=cap title="{html.escape(flag)}">cap</span>' if flag else ""


def _value(row: HeadlineRow, name: str | None, value: float | None, low: float | None, high: float | None) -> str:
    if name is None or value is None:
        return "–"
    unit = f" {html.escape(row.unit)}" if row.unit else ""
    spread = ""
    if row.runs > 1 and low is not None and high is not None and low != high:
        spread = f" <small>({fmt(low)}–{fmt(high)})</small>"
    return (f"<b>{_name(name)}</b><br><span class=num>{fmt(value)}{unit}</span>{spread}"
            f"{_capped(row, name)}")


def _where(row: HeadlineRow) -> str:
    return f"{_name(row.comparison)}<br><small>{_name(row.scenario)}</small>"


def _measure(row: HeadlineRow) -> str:
    return f"{html.escape(row.measure)}<br><small>{row.better} is better</small>"


def _ranking(row: HeadlineRow, skip: int) -> str:
    unit = f" {html.escape(row.unit)}" if row.unit else ""
    return "<br>".join(f"{_name(name)} <span class=num>{fmt(value)}{unit}</span>{_capped(row, name)}"
                     for name, value in row.ranking[skip:]) or "–"


def _table(kind: str, head: Sequence[tuple[str, int]], rows: list[str]) -> str:
    columns = "".join(f'<col style="width:{width}%">' for _, width in head)
    header = "".join(f"<th>{html.escape(title)}</th>" for title, _ in head)
    return (f"<div class=scroll><table class={kind}><colgroup>{columns}</colgroup>"
            f"<tr>{header}</tr>{''.join(rows)}</table></div>")


def headline_table(rows: Sequence[HeadlineRow]) -> str:
    """The headlined rows: who wins, by how much, with the run-to-run spread."""
    body = [f"<tr><td>{_where(r)}</td><td>{_measure(r)}</td>"
            f"<td class=win>{_value(r, r.winner, r.value, r.low, r.high)}</td>"
            f"<td>{_value(r, r.runner_up, r.runner_up_value, r.runner_up_low, r.runner_up_high)}</td>"
            f"<td>{html.escape(r.margin)}</td><td>{html.escape(r.spread)}</td><td>{_ranking(r, 2)}</td></tr>"
            for r in rows]
    head = (("comparison, scenario", 14), ("measure", 15), ("winner", 14), ("runner-up", 14), ("by how much", 12),
            ("run-to-run spread", 14), ("the others, best first", 17))
    return _table("headline", head, body)


def quiet_table(rows: Sequence[HeadlineRow]) -> str:
    """The rows not headlined, each with its reason."""
    body = [f"<tr><td>{_where(r)}</td><td>{_measure(r)}</td><td>{_ranking(r, 0)}</td>"
            f"<td class=why>{html.escape(r.why_not)}</td></tr>" for r in rows]
    head = (("comparison, scenario", 16), ("measure", 18), ("values, best first", 26), ("why it is not headlined", 40))
    return _table("quiet", head, body)


def findings_html(rows: Sequence[HeadlineRow], notes: Sequence[str]) -> str:
    """The Findings section's body: headlined rows, rows not headlined, capped values, notes."""
    loud = [r for r in rows if r.headlined]
    quiet = [r for r in rows if not r.headlined]
    parts = ["<p class=note>Per comparison and scenario, the plugin that wins each headline measure: medians over "
             "repetitions, with the range (min–max) over runs; a win is clear only when the two ranges do not "
             "overlap. A row is headlined only when the difference is above the measure's noise floor and its "
             "resolution, outside the run-to-run spread, and neither value sits at a known wait or timeout.</p>"]
    if loud:
        parts.append(headline_table(loud))
    elif rows:
        parts.append("<p><b>Nothing to headline:</b> every difference below is noise or capped.</p>")
    else:
        parts.append("<p>No measure had two contenders that finished.</p>")
    if quiet:
        parts.append(f"<h3>Not headlined ({len(quiet)})</h3>")
        parts.append(quiet_table(quiet))
    capped = [f"[{r.comparison}] {r.scenario}, {r.measure}: {flag}" for r in rows for flag in r.flags]
    if capped:
        parts.append("<h3>Values at a known cap</h3><p class=note>A latency at a wait or timeout measured that "
                     "wait, not the plugins (a percentile reads the upper edge of its histogram bucket: 500 ms "
                     "reads 501.19 ms). A failover recovery that was never seen counts as the time it was watched: "
                     "a lower bound.</p>")
        parts.append("<ul>" + "".join(f"<li><span class=cap>cap</span> {html.escape(c)}</li>" for c in capped)
                     + "</ul>")
    if notes:
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{n}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)
