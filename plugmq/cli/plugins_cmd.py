"""``plugmq plugins`` and ``plugmq check-config``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import attrs
import click
from rich.console import Console
from rich.table import Table

from plugmq.cli import ERROR_PREFIX
from plugmq.cli.layout import print_table
from plugmq.core.errors import ConfigError
from plugmq.core.pluginmanager import installed_plugins
from plugmq.kit.native import KernelStatus, kernel_statuses


def _field_text(value: object) -> str:
    """A capability field; a tuple of values (a filter's examples) shows as how many there are."""
    if isinstance(value, tuple) and value and all(attrs.has(type(item)) for item in value):
        return f"{len(value)} declared"
    return str(value)


def _capabilities_text(value: object) -> str:
    if value is None:
        return "-"
    if attrs.has(type(value)):
        shown = {k: v for k, v in attrs.asdict(cast(attrs.AttrsInstance, value), recurse=False).items()
                 if v not in (None, {}, ())}
        return ", ".join(f"{k}={_field_text(v)}" for k, v in shown.items()) or "-"
    if isinstance(value, Mapping):  # keyed capabilities, e.g. one value per allocation strategy
        return "\n".join(f"{k}: {_capabilities_text(v)}" for k, v in value.items())
    return str(value)


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json: bool) -> None:
    """List installed plugins (entry-point group plugmq.plugins): family, version, capabilities."""
    rows: list[dict[str, Any]] = []
    for plugin in installed_plugins():
        decl = plugin.declaration
        rows.append({
            "name": plugin.name,
            "families": sorted(f.value for f in decl.families) if decl else [],
            "version": plugin.version,
            "distribution": plugin.distribution,
            "capabilities": _capabilities_text(decl.capabilities) if decl else "-",
            "error": plugin.error,
        })
    kernels = kernel_statuses()  # the plugins are imported now, and with them their kernels
    for row in rows:
        row["kernels"] = [_kernel_row(status) for status in kernels if row["name"] in status.kernel.users]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="plugmq plugins (entry points in group plugmq.plugins)")
    for column in ("name", "family", "version", "distribution", "capabilities"):
        table.add_column(column, no_wrap=column in ("name", "version", "distribution"))
    for row in rows:
        caps = row["capabilities"] if not row["error"] else f"[red]not loadable: {row['error']}[/red]"
        table.add_row(row["name"], ", ".join(row["families"]) or "?", row["version"], row["distribution"], caps)
    console = Console()
    print_table(table, console)
    if kernels:
        print_table(_kernel_table(kernels), console)


def _kernel_row(status: KernelStatus) -> dict[str, Any]:
    return {"module": status.kernel.module, "in_use": status.in_use, "reason": status.reason,
            "fallback": status.kernel.fallback, "cost": status.kernel.cost}


def _kernel_table(statuses: list[KernelStatus]) -> Table:
    table = Table(title="compiled kernels (C, each with a Python twin that runs when it is not in use)")
    for column in ("kernel", "used by", "in use", "without it"):
        table.add_column(column, no_wrap=column == "kernel")
    for status in statuses:
        kernel = status.kernel
        without = f"{kernel.fallback}; {kernel.cost}"
        table.add_row(kernel.module, ", ".join(kernel.users), "yes" if status.in_use else f"[red]no: {status.reason}[/red]",
                      without)
    return table


@click.command("check-config")
@click.argument("config_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--reference", is_flag=True,
              help="Print every key of every table (types, defaults, meaning) instead of checking a file.")
@click.option("--builtin-only", is_flag=True,
              help="With --reference: only plugmq's own plugins (how docs/configuration.md is made).")
def check_config(config_file: Path | None, reference: bool, builtin_only: bool) -> None:
    """Validate CONFIG_FILE and print the broker it assembles (nothing is opened or written).

    Every problem of the file is reported, one line each, not only the first.
    """
    if reference:
        from plugmq.cli.reference import reference_text

        click.echo(reference_text(builtin_only=builtin_only), nl=False)
        return
    if config_file is None:
        raise click.UsageError("give the CONFIG_FILE to check (or --reference for every key)")
    from plugmq.config.check import check_config_file

    check = check_config_file(config_file)  # an unreadable file is one error line (plugmq.cli reports it)
    errors = list(check.problems)
    server_checked = _check_server_table(config_file, check.tables.get("server"), errors)
    if errors or check.config is None:
        for error in errors:
            click.echo(ERROR_PREFIX + error, err=True)
        raise SystemExit(1)
    config = check.config
    table = Table(title=f"broker {config.name!r} from {config.source}")
    table.add_column("plugin", no_wrap=True)
    table.add_column("families")
    table.add_column("options")
    for name, declaration in check.declarations.items():
        table.add_row(name, ", ".join(sorted(f.value for f in declaration.families)),
                      json.dumps(config.plugin_options.get(name, {})) or "{}")
    console = Console()
    print_table(table, console)
    console.print(f"data_dir={config.data_dir} default_queue_count={config.default_queue_count} "
                  f"auto_create_topic={config.auto_create_topic} max_message_size={config.max_message_size}")
    if server_checked is not None:
        console.print(server_checked)
    console.print("[green]config OK[/green]")


def _check_server_table(config_file: Path, table: Any, errors: list[str]) -> str | None:
    """Validate ``[server]`` as ``plugmq serve`` would; returns a line for the summary, or None
    when the file has no [server] table."""
    if table is None:
        return None
    try:
        from plugmq.server.options import parse_server_table
    except ModuleNotFoundError as exc:
        return (f"[yellow][server] not checked: plugmq serve needs the 'serve' extra ({exc.name} is missing): "
                "pip install 'plugmq[serve]'[/yellow]")
    try:
        options = parse_server_table(table, source=str(config_file), config_file=config_file)
    except ConfigError as exc:
        errors.extend(line for line in exc.problems if line not in errors)
        return None
    return f"[server] listen={options.listen} (checked as plugmq serve reads it)"
