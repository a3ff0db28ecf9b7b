"""``plugmq filter check``: compile a subscription, show how it was read, and try it on a message.

    plugmq filter check --type SQL92 "a > 5 AND b IN ('x')" --props a=7 b=x [--tags TAGA]

Prints the parsed form (with the parentheses precedence implies), the pre-check verdict and the
result: TRUE, FALSE, UNKNOWN, or the evaluation error. A syntax error prints the expression with
a caret under the offending position and exits with status 2.
"""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from plugmq.cli.layout import print_table
from plugmq.core.contracts import BloomPrecheck, DescribedFilter, Filter, PropertyRequirements
from plugmq.core.errors import FilterEvaluationError, FilterSyntaxError
from plugmq.core.hashing import tags_code
from plugmq.core.message import ConsumeQueueEntry

__all__ = ["command", "render_syntax_error"]


def render_syntax_error(error: FilterSyntaxError) -> str:
    """The message, then the offending line of the expression with a caret under the position."""
    lines = [f"syntax error: {error}"]
    expression, position = error.expression, error.position
    if expression and position is not None and 0 <= position <= len(expression):
        start = expression.rfind("\n", 0, position) + 1
        end = expression.find("\n", position)
        line = expression[start : end if end >= 0 else len(expression)]
        column = position - start
        shown = line.replace("\t", " ")
        lines.append(f"  {shown}")
        lines.append("  " + " " * column + "^")
    if error.expected:
        lines.append(f"expected: {error.expected}")
    return "\n".join(lines)


def parse_pairs(pairs: tuple[str, ...], param_hint: str = "properties") -> dict[str, str]:
    """``NAME=VALUE`` words as a dict (also ``plugmq send --property``); BadParameter for a word without "="."""
    props: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint=param_hint)
        props[name] = value
    return props


@click.group("filter")
def command() -> None:
    """Work with subscription filters (TAG, SQL92, and any installed filter plugin)."""


@command.command("check")
@click.option("--type", "expression_type", default="SQL92", show_default=True,
              help="Expression type: TAG, SQL92, or another installed filter plugin's type.")
@click.argument("expression")
@click.argument("pairs", nargs=-1, metavar="[NAME=VALUE]...")
@click.option("--props", "props_flag", is_flag=True,
              help="Marks the NAME=VALUE arguments that follow as message properties (optional).")
@click.option("--prop", "-p", "prop_options", multiple=True, metavar="NAME=VALUE", help="One property; repeatable.")
@click.option("--tags", default=None, help="The message's tags, e.g. TAGA or 'TAGA||TAGB'.")
def check(expression_type: str, expression: str, pairs: tuple[str, ...], props_flag: bool,
          prop_options: tuple[str, ...], tags: str | None) -> None:
    """Compile EXPRESSION and evaluate it on a message with the given properties and tags."""
    from plugmq.core.pluginmanager import installed_filter_compilers

    properties = parse_pairs(pairs + prop_options)
    compilers = installed_filter_compilers()
    compiler = compilers.get(expression_type.upper())
    if compiler is None:
        known = ", ".join(sorted(compilers)) or "none"
        raise click.BadParameter(f"no installed filter plugin handles {expression_type!r}; installed: {known}",
                                 param_hint="--type")
    try:
        flt = compiler.compile(expression)
    except FilterSyntaxError as exc:
        click.echo(render_syntax_error(exc), err=True)
        sys.exit(2)
    _report(flt, properties, tags)


def _report(flt: Filter, properties: dict[str, str], tags: str | None) -> None:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()  # wraps between words: a property name or tag stays whole
    table.add_row("type", escape(flt.expression_type))
    table.add_row("expression", escape(flt.expression))
    table.add_row("parsed", escape(flt.describe() if isinstance(flt, DescribedFilter) else str(flt)))
    if isinstance(flt, PropertyRequirements):
        table.add_row("required for TRUE", escape(", ".join(sorted(flt.required_properties))) or "(none)")
    table.add_row("properties", escape(", ".join(f"{k}={v!r}" for k, v in properties.items())) or "(none)")
    table.add_row("tags", escape(tags) if tags is not None else "(none)")
    code = tags_code(tags)
    passed = flt.precheck(ConsumeQueueEntry(queue_offset=0, commit_log_offset=0, size=0, tags_code=code))
    verdict = "pass" if passed else "reject (the broker would skip this message)"
    table.add_row("broker pre-check", f"{verdict}  (tag code {code})")
    if isinstance(flt, BloomPrecheck):
        ok = flt.precheck_bloom(flt.property_bloom(properties, tags))
        table.add_row("property-bloom pre-check", "pass" if ok else "reject (a required property is missing)")
    try:
        result = flt.evaluate(properties, tags)
        shown = {True: "[green]TRUE[/green]", False: "[red]FALSE[/red]", None: "[yellow]UNKNOWN[/yellow]"}[result]
        table.add_row("result", shown + ("" if result is True else "  (not delivered)"))
    except FilterEvaluationError as exc:
        table.add_row("result", f"[red]EVALUATION ERROR[/red]: {escape(str(exc))}  (not delivered)")
    print_table(table, Console(highlight=False))
