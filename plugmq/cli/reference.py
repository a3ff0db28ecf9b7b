"""``plugmq check-config --reference``: every key of every table, generated from the schemas.

docs/configuration.md is this text for plugmq's own plugins (tests/test_config_reference.py keeps it
current: ``plugmq check-config --reference --builtin-only > docs/configuration.md``).
"""

from __future__ import annotations

from plugmq.config.reference import CONFIG_TABLES, reference
from plugmq.core.pluginmanager import installed_plugins

__all__ = ["reference_text"]

_INTRO = """# plugmq configuration reference

Generated from the schemas by `plugmq check-config --reference`; do not edit by hand. Every table is
an attrs class checked by one engine (`plugmq.core.schema`): `plugmq check-config FILE` reports every
problem of a file, one line each, with the key path, the value, what is expected and the fix.
A key left out keeps its default; `(unset)` means the key is optional and has no value unless given.

"""


def _server_tables() -> tuple[tuple[str, type], ...]:
    try:
        from plugmq.server.options import SERVER_TABLES
    except ModuleNotFoundError:  # the serve extra is not installed: plugmq serve is not there
        return ()
    return SERVER_TABLES


def _plugin_tables(builtin_only: bool) -> tuple[tuple[str, type], ...]:
    tables = []
    for plugin in installed_plugins():
        declaration = plugin.declaration
        if declaration is None or declaration.options is None:
            continue
        if builtin_only and plugin.distribution != "plugmq":
            continue
        tables.append((f"plugins.{plugin.name}", declaration.options))
    return tuple(sorted(tables, key=lambda table: table[0]))


def _experiment_tables() -> tuple[tuple[str, type], ...]:
    from plugmq.spark.experiments import EXPERIMENT_TABLES

    return EXPERIMENT_TABLES


def reference_text(*, builtin_only: bool = False) -> str:
    """The reference page: the broker config's tables, ``[server]``, every plugin's table, experiment files."""
    return "\n".join([
        _INTRO.rstrip() + "\n",
        reference((*CONFIG_TABLES, *_server_tables()), "Broker config file"),
        reference(_plugin_tables(builtin_only), "Plugin tables ([plugins.<name>])"),
        reference(_experiment_tables(), "Experiment files (plugmq compare)"),
    ])
