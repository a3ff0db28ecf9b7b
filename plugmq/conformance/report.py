"""A failed conformance clause in a few lines: the clause, its rule, the plugin's answer.

A plugin author running ``plugmq conformance --plugin NAME`` needs to know which rule the plugin
broke and what it answered, not the suite's internals: pytest's report of a Hypothesis clause
runs to hundreds of lines of tracebacks. :func:`render_failure` writes instead::

    clause   TestFilterContract::test_declared_examples_match_as_declared[xpath:XPATH]
    rule     Each declared example compiles, matches its matching messages ...
    answer   example '/a' must match FilterSample(...), but evaluate answered False
    at       plugmq/conformance/filters.py:316 (the clause's check)
    example  Failing test case: ... (Hypothesis' smallest failing input, when there is one)

and, when the plugin raised something else than the clause's own assertion, what it raised and
where in the plugin's code. ``--plugmq-tracebacks`` restores pytest's full report.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from pathlib import Path
from typing import Protocol

import pytest

__all__ = ["is_clause", "render_failure"]


class _Entry(Protocol):
    """What the report reads of a traceback entry (pytest's TracebackEntry)."""

    @property
    def path(self) -> object: ...

    @property
    def lineno(self) -> int: ...

    @property
    def name(self) -> str: ...

_SUITE = Path(__file__).resolve().parent
_FOOTER = "(pytest's full report: add --plugmq-tracebacks)"
_MAX_ANSWER_LINES = 12
_NOT_THE_PLUGIN = ("/_pytest/", "/pluggy/", "/hypothesis/", "/site-packages/attr/", "/site-packages/attrs/")


def is_clause(item: pytest.Item) -> bool:
    """Whether ``item`` runs a clause of the shared suite (a method defined in plugmq.conformance)."""
    if not isinstance(item, pytest.Function):
        return False
    module = inspect.getmodule(inspect.unwrap(item.function))
    return module is not None and module.__name__.startswith("plugmq.conformance.")


def _rule(item: pytest.Item) -> str:
    doc = inspect.getdoc(inspect.unwrap(item.function)) if isinstance(item, pytest.Function) else None
    if not doc:
        return "(the clause has no docstring; see the family's contract in plugmq.core.contracts)"
    return " ".join(doc.split("\n\n")[0].split())


def _answer(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if not isinstance(error, (AssertionError, pytest.fail.Exception)):
        text = f"{type(error).__name__}: {text}"
    lines = text.splitlines()
    if len(lines) > _MAX_ANSWER_LINES:
        lines = [*lines[:_MAX_ANSWER_LINES], f"... ({len(lines) - _MAX_ANSWER_LINES} more lines)"]
    return "\n".join(lines)


def _shown(path: object) -> str:
    """A frame's file: from ``plugmq/`` for the suite's files, else relative to the working directory."""
    resolved = Path(str(path)).resolve()
    if resolved.is_relative_to(_SUITE.parent.parent):
        return resolved.relative_to(_SUITE.parent.parent).as_posix()
    return os.path.relpath(resolved) if resolved.is_relative_to(Path.cwd()) else str(resolved)


def _where(entry: _Entry) -> str:
    return f"{_shown(entry.path)}:{entry.lineno + 1} in {entry.name}"


def _in_suite(entry: _Entry) -> bool:
    return Path(str(entry.path)).resolve().is_relative_to(_SUITE)


def _locations(excinfo: pytest.ExceptionInfo[BaseException]) -> list[tuple[str, str]]:
    entries = list(excinfo.traceback)
    rows = []
    clause = next((e for e in reversed(entries) if _in_suite(e)), None)
    if clause is not None:
        rows.append(("at", _where(clause) + "  (the clause's check)"))
    innermost = entries[-1] if entries else None
    if (innermost is not None and not _in_suite(innermost)
            and not any(part in str(innermost.path) for part in _NOT_THE_PLUGIN)):
        rows.append(("raised", f"{_where(innermost)}  ({_whose(innermost)})"))
    return rows


def _whose(entry: _Entry) -> str:
    """Whose code a frame is: a plugin's (installed, or built into plugmq.plugins) or plugmq's."""
    path = Path(str(entry.path)).resolve()
    package = _SUITE.parent
    if path.is_relative_to(package) and not path.is_relative_to(package / "plugins"):
        return "in plugmq, called with what the plugin gave"
    return "in the plugin"


def _failure_rows(error: BaseException) -> list[tuple[str, str]]:
    """answer, where, and Hypothesis' falsifying example of one failure."""
    rows = [("answer", _answer(error)), *_locations(pytest.ExceptionInfo.from_exception(error))]
    # Hypothesis' note names the failing input; the suite object's repr says nothing to an author.
    notes = ["\n".join(line for line in str(note).splitlines() if "self=<" not in line)
             for note in getattr(error, "__notes__", ())]
    if notes:
        rows.append(("example", "\n".join(notes)))
    return rows


_LABEL_WIDTH = len("example")  # the longest label: every block lines up the same


def _format(rows: list[tuple[str, str]]) -> list[str]:
    pad = " " * (_LABEL_WIDTH + 2)
    return [f"{label.ljust(_LABEL_WIDTH)}  {textwrap.indent(text, pad).lstrip()}" for label, text in rows]


def render_failure(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException], when: str) -> str:
    """The compact report of a failed clause (``when``: setup, call or teardown)."""
    clause = item.nodeid.split("::", 1)[-1]
    head = [("clause", clause + ("" if when == "call" else f"  (failed in {when})")), ("rule", _rule(item))]
    error = excinfo.value
    if not isinstance(error, BaseExceptionGroup):
        return "\n".join([*_format([*head, *_failure_rows(error)]), _FOOTER])
    lines = _format([*head, ("answer", f"{len(error.exceptions)} distinct failures:")])
    for number, failure in enumerate(error.exceptions, 1):
        lines += [f"--- failure {number}", *_format(_failure_rows(failure))]
    return "\n".join([*lines, _FOOTER])
