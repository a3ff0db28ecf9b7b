"""The report of a chaos run: ``summary.json``, ``report.md`` and the ``timeline.png`` chart.

The chart (matplotlib, no display needed): send OK / send failed / ack OK rates over time with
each fault's window shaded and named, the acks of lost messages and the redeliveries after an OK
ack marked; below, which broker said it was master when.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plugmq.chaos.checker import CheckResult
from plugmq.chaos.history import Ack, Event, FaultWindow, RoleSample, Send

__all__ = ["write_report"]

_BIN_S = 0.5


def _rate(times: list[float], end: float) -> tuple[list[float], list[float]]:
    bins = max(1, int(end / _BIN_S) + 1)
    counts = [0] * bins
    for t in times:
        counts[min(bins - 1, int(t / _BIN_S))] += 1
    return [i * _BIN_S for i in range(bins)], [c / _BIN_S for c in counts]


def _master_spans(samples: list[RoleSample], mode_roles: set[str], end: float) -> dict[str, list[tuple[float, float]]]:
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for sample in sorted(samples, key=lambda s: s.t):
        spans.setdefault(sample.broker, [])
        if sample.role in mode_roles:
            since.setdefault(sample.broker, sample.t)
        elif sample.broker in since:
            start = since.pop(sample.broker)
            spans[sample.broker].append((start, sample.t - start))
    for broker, start in since.items():
        spans[broker].append((start, end - start))
    return spans


def write_timeline(path: Path, events: Sequence[Event], checked: CheckResult, mode: str) -> None:
    """The timeline chart as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sends = [e for e in events if isinstance(e, Send)]
    acks = [e for e in events if isinstance(e, Ack)]
    windows = [e for e in events if isinstance(e, FaultWindow)]
    roles = [e for e in events if isinstance(e, RoleSample)]
    end = max([s.t1 for s in sends] + [a.t1 for a in acks] + [w.t1 for w in windows] + [1.0])
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=[3, 1])
    _draw_rates(top, sends, acks, windows, end)
    _mark_broken_promises(top, sends, checked)
    top.set_ylabel(f"operations / s ({_BIN_S:g} s bins)")
    top.legend(loc="upper right", fontsize=8)
    spans = _master_spans(roles, {mode}, end)
    for row, (_broker, broker_spans) in enumerate(sorted(spans.items())):
        bottom.broken_barh(broker_spans, (row - 0.4, 0.8), color="tab:purple")
    bottom.set_yticks(range(len(spans)), [f"{b} master" for b in sorted(spans)])
    bottom.set_xlabel("seconds since the run began")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _draw_rates(axes: Any, sends: list[Send], acks: list[Ack], windows: list[FaultWindow], end: float) -> None:
    """Send OK / send failed / ack OK rates as steps, each fault's window shaded and named."""
    for label, times, colour in (("send OK", [s.t1 for s in sends if s.ok], "tab:blue"),
                                 ("send failed", [s.t1 for s in sends if not s.ok], "tab:red"),
                                 ("ack OK", [a.t1 for a in acks if a.ok], "tab:green")):
        x, y = _rate(times, end)
        axes.step(x, y, where="post", label=label, color=colour, linewidth=1)
    for window in windows:
        axes.axvspan(window.t0, window.t1, color="tab:orange", alpha=0.2)
        axes.text(window.t0, 1.0, f"{window.name} #{window.round}\n{window.target}", fontsize=7, va="top",
                  transform=axes.get_xaxis_transform())


def _mark_broken_promises(axes: Any, sends: list[Send], checked: CheckResult) -> None:
    """Marks on the time axis: acked-then-lost sends, redeliveries after an OK ack, deposed masters' acks."""
    lost = set(checked.lost)
    redelivered = [r.delivered_at for r in checked.redelivered_after_ack]
    stale = [a.acked_at for a in checked.stale_acks]
    marks = (([s.t1 for s in sends if s.ok and s.body in lost], "x", "black", f"acked, then lost ({len(lost)})"),
             (redelivered, "v", "purple", f"redelivered after an OK ack ({len(redelivered)})"),
             (stale, "^", "tab:brown", f"acked by a deposed master ({len(stale)})"))
    for times, marker, colour, label in marks:
        if times:
            axes.plot(times, [0] * len(times), marker, color=colour, label=label)


def _recovery(seconds: dict[str, Any]) -> str:
    text = f"{seconds['median']} / {seconds['max']}" if seconds["median"] is not None else "-"
    if seconds["never"]:
        text += f" ({seconds['never']} never: at least)"
    return text


def _markdown(summary: dict[str, Any], checked: CheckResult) -> str:
    totals = summary["totals"]
    lines = [f"# plugmq chaos: {summary['mode']}, {summary['brokers']} brokers, "
             f"session timeout {summary['session_timeout_s']:g} s",
             "", f"Config: `{summary['config']}`; {summary['rounds']} round(s) a fault; seed {summary['seed']}; "
             f"load average before {summary['load_average']['before']}, after {summary['load_average']['after']}.",
             "", "**" + ("An acknowledged message was lost or redelivered after an OK ack."
                         if checked.promise_broken else "Every acknowledged message held.") + "**", "",
             "| fault | OpenChaos | rounds | lost | redelivered after ack | acked by a deposed master (longest s) "
             "| send recovery s (median / max) | receive recovery s (median / max) |", "|---|---|---|---|---|---|---|---|"]
    for name, row in summary["faults"].items():
        lines.append(f"| {name} | {row['openchaos']} | {row['rounds']} | {row['lost']} | {row['redelivered_after_ack']} "
                     f"| {row['acked_by_deposed_master']} ({row['split_brain_s']}) "
                     f"| {_recovery(row['send_recovery_s'])} | {_recovery(row['receive_recovery_s'])} |")
    lines += ["", "| totals | |", "|---|---|"] + [f"| {key} | {value} |" for key, value in totals.items()]
    lines += ["", "![timeline](timeline.png)", ""]
    examples: list[tuple[str, list[Any]]] = [("lost", list(checked.lost)), ("redelivered after an OK ack", list(checked.redelivered_after_ack)),
                ("positions holding two messages", list(checked.position_conflicts)),
                ("acked by a deposed master", list(checked.stale_acks)),
                ("reordered", list(checked.reordered)), ("stored twice", list(checked.stored_twice))]
    for title, found in examples:
        if found:
            lines += [f"## {title}: {len(found)}", ""] + [f"- {item}" for item in found[:20]] + [""]
    if summary["notes"]:
        lines += ["## notes", ""] + [f"- {note}" for note in summary["notes"]] + [""]
    return "\n".join(lines)


def write_report(where: Path, summary: dict[str, Any], checked: CheckResult, events: Sequence[Event]) -> None:
    """``summary.json``, ``report.md`` and ``timeline.png`` in ``where``."""
    (where / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    write_timeline(where / "timeline.png", events, checked, summary["mode"])
    (where / "report.md").write_text(_markdown(summary, checked), encoding="utf-8")
