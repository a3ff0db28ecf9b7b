"""pytest plugin (entry point ``pytest11``): the conformance suite's option, markers and report.

- ``--plugmq-plugin NAME`` (repeatable) names the installed plugins under test.
- Clauses of a family none of the named plugins declares are left out (deselected, counted in
  pytest's summary), not reported as skips: ``plugmq conformance --plugin store_x`` runs the
  storage clauses and the broker clauses (every plugin is also run inside a broker).
- ``@pytest.mark.plugmq_damages_files(what)`` marks a clause that damages the plugin's files on
  purpose (only under pytest's temporary directories); the runner lists those clauses before
  they run and their outcomes at the end.
- A failed clause is reported in a few lines (:mod:`plugmq.conformance.report`): the clause, the
  rule it checks (its docstring), the plugin's answer (the assertion's message, or what the
  plugin raised and where), and Hypothesis' falsifying example; ``--plugmq-tracebacks`` shows
  pytest's full report instead.

Outside a conformance run (no ``--plugmq-plugin``) the hooks change nothing.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from plugmq.conformance.report import is_clause, render_failure

NOT_APPLICABLE = "plugmq_not_applicable"
DAMAGES_FILES = "plugmq_damages_files"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("plugmq", "plugmq conformance suite")
    group.addoption(
        "--plugmq-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="installed plugmq plugin (entry-point name) to run the conformance suite against; repeatable",
    )
    group.addoption(
        "--plugmq-examples",
        type=int,
        default=None,
        metavar="N",
        help="at most N Hypothesis examples per property clause (a quick first pass; default: each clause's own)",
    )
    group.addoption(
        "--plugmq-tracebacks",
        action="store_true",
        default=False,
        help="report failed conformance clauses with pytest's full tracebacks instead of a compact summary",
    )


def pytest_configure(config: pytest.Config) -> None:
    limit = config.getoption("--plugmq-examples")
    if limit is not None:
        if limit < 1:
            raise pytest.UsageError(f"--plugmq-examples takes a number >= 1, got {limit}")
        from plugmq.conformance.budget import cap_examples

        cap_examples(limit)
    config.addinivalue_line(
        "markers", f"{DAMAGES_FILES}(what): the clause damages the plugin's files on purpose (what it does to them)")
    config.addinivalue_line(
        "markers", f"{NOT_APPLICABLE}(family): a clause of a family the plugins under test do not declare")


def plugins_under_test(config: pytest.Config) -> list[str]:
    return list(config.getoption("--plugmq-plugin") or [])


def _families(plugin: str) -> str:
    from plugmq.core.errors import PlugmqError
    from plugmq.core.pluginmanager import load_plugins

    try:
        declaration = load_plugins([plugin], check_cardinality=False).declarations[plugin]
    except PlugmqError as exc:
        return f"not loadable: {exc}"
    return ", ".join(sorted(f.value for f in declaration.families)) or "no family"


def _damage(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker(DAMAGES_FILES)
    if marker is None:
        return None
    return str(marker.args[0]) if marker.args else "damages the plugin's files"


_LEFT_OUT = pytest.StashKey[tuple[int, list[str]]]()
_DAMAGING = pytest.StashKey[dict[str, str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    left_out = [item for item in items if item.get_closest_marker(NOT_APPLICABLE) is not None]
    if left_out:
        families = sorted({str(m.args[0]) for item in left_out for m in item.iter_markers(NOT_APPLICABLE) if m.args})
        config.stash[_LEFT_OUT] = (len(left_out), families)
        items[:] = [item for item in items if item.get_closest_marker(NOT_APPLICABLE) is None]
        config.hook.pytest_deselected(items=left_out)
    config.stash[_DAMAGING] = {item.nodeid: what for item in items if (what := _damage(item)) is not None}


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    names = plugins_under_test(config)
    if not names:
        return []
    lines = [f"plugmq conformance: {', '.join(f'{name} ({_families(name)})' for name in names)}"]
    count, families = config.stash.get(_LEFT_OUT, (0, []))
    if count:
        lines.append(f"  left out: {count} clauses of families not declared ({', '.join(families)})")
    lines += _broker_lines(config, items, names)
    limit = config.getoption("--plugmq-examples")
    if limit is not None:
        lines.append(f"  at most {limit} Hypothesis examples per property clause (--plugmq-examples): a quick pass")
    damaging = config.stash.get(_DAMAGING, {})
    if damaging:
        lines.append("  clauses that damage the plugin's files on purpose (in pytest's temporary directories):")
        lines += [f"    {nodeid}: {what}" for nodeid, what in damaging.items()]
    return lines


def _broker_lines(config: pytest.Config, items: list[pytest.Item], names: list[str]) -> list[str]:
    """Which broker each named plugin's broker clauses run in, and their consumers' strategy."""
    if not any(isinstance(item, pytest.Function) and "broker_plugins" in item.fixturenames for item in items):
        return []
    from plugmq.conformance import plan
    from plugmq.core.contracts import Family

    lines = []
    for name in names:
        if Family.CLUSTER in plan.declaration(name).families:
            continue
        under_test = plan.compose_broker(name, names)
        strategy = under_test.strategy or "none offered"
        lines.append(f"  broker clauses of {name}: plugins {', '.join(under_test.plugins)}; consumers on {strategy}")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    damaging = config.stash.get(_DAMAGING, {})
    if not plugins_under_test(config) or not damaging:
        return
    outcomes: dict[str, str] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = report.nodeid if isinstance(report, pytest.TestReport) else None
            if nodeid in damaging and outcomes.get(nodeid) in (None, "passed"):
                outcomes[nodeid] = outcome
    terminalreporter.section("plugmq: clauses that damaged the plugin's files on purpose")
    for nodeid, what in damaging.items():
        terminalreporter.write_line(f"{outcomes.get(nodeid, 'not run').upper():8} {nodeid}: {what}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (report.failed and call.excinfo is not None and plugins_under_test(item.config)
            and not item.config.getoption("--plugmq-tracebacks") and is_clause(item)):
        report.longrepr = render_failure(item, call.excinfo, report.when)
    return report
