"""``plugmq conformance --plugin NAME``: run the shared conformance suite against installed plugins."""

from __future__ import annotations

import click
import pytest


@click.command("conformance", context_settings={"ignore_unknown_options": True})
@click.option("--plugin", "plugins", multiple=True, required=True, help="Installed plugin (entry-point name); repeatable.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(plugins: tuple[str, ...], pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite for PLUGIN(s); extra arguments go to pytest (e.g. -k, -x, -q)."""
    args = ["--pyargs", "plugmq.conformance", "-p", "no:cacheprovider"]
    for plugin in plugins:
        args += ["--plugmq-plugin", plugin]
    code = pytest.main([*args, *pytest_args])
    raise SystemExit(int(code))
