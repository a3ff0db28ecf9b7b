"""Every problem of a broker config file, found without opening or writing anything (``plugmq check-config``).

The tables (:func:`plugmq.config.broker.load_config`), the plugins they list and each plugin's
options (checked against its declared class by the same engine), and ``broker.data_dir`` (usable, or
creatable). A problem in one table does not hide those of another.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.config.broker import BrokerConfig, listed_plugins, load_config, read_toml
from plugmq.config.datadir import check_data_dir
from plugmq.core import PluginDeclaration
from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.core.pluginmanager import build_options, load_plugins

__all__ = ["FileCheck", "check_config_file"]


@attrs.frozen
class FileCheck:
    """What :func:`check_config_file` found: the config (None if its tables are invalid), the
    declarations of the plugins it lists, the file's tables as read, and every problem (one line each)."""

    config: BrokerConfig | None
    declarations: Mapping[str, PluginDeclaration]
    tables: Mapping[str, Any]
    problems: tuple[str, ...]


def _lines(exc: PlugmqError) -> tuple[str, ...]:
    return exc.problems if isinstance(exc, ConfigError) else (str(exc),)


def check_config_file(path: Path) -> FileCheck:
    """Check a broker config file; raises ConfigError only when it cannot be read as TOML."""
    tables = read_toml(path)
    source = str(path)
    problems: list[str] = []
    config: BrokerConfig | None = None
    try:
        config = load_config(path)
    except ConfigError as exc:
        problems.extend(exc.problems)
    broker = tables.get("broker")
    plugins = config.plugins if config is not None else listed_plugins(broker) if isinstance(broker, Mapping) else None
    options = tables.get("plugins")
    options = options if isinstance(options, Mapping) else {}
    declarations: Mapping[str, PluginDeclaration] = {}
    if plugins is not None:
        try:
            declarations = load_plugins(plugins, config_path=f"{source}: broker.plugins").declarations
        except PlugmqError as exc:
            problems.extend(_lines(exc))
    for name, declaration in declarations.items():
        table = options.get(name)
        if table is not None and not isinstance(table, Mapping):
            continue  # load_config said so
        try:
            build_options(declaration, table, config_path=f"{source}: plugins.{name}")
        except PlugmqError as exc:
            problems.extend(_lines(exc))
    if config is not None:
        try:
            check_data_dir(config.data_dir, config.source)  # usable, or creatable (nothing is created)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return FileCheck(config, declarations, tables, tuple(problems))
