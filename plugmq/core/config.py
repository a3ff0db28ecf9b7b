"""Broker configuration: a TOML file or a mapping, validated into a frozen BrokerConfig.

::

    [broker]
    name = "broker-a"
    data_dir = "./data"
    plugins = ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "alloc"]

    [plugins.store_mmap]
    flush = "sync"

Every error names the key path (``broker.plugins[2]``, ``plugins.store_mmap.flush``) and the fix.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.errors import ConfigError, InvalidNameError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE, _host_bytes
from plugmq.core.names import validate_topic

__all__ = ["DEFAULT_PLUGINS", "BrokerConfig", "load_config"]

#: The documented default plugin set, used when a config names no plugins.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "store_mmap",
    "delay_wheel",
    "filter_tag",
    "filter_sql",
    "alloc",
    "txn",
)


@attrs.frozen
class BrokerConfig:
    """The ``[broker]`` table plus every plugin's raw option table (validated at assembly)."""

    name: str = "broker-a"
    data_dir: Path = attrs.field(default=Path("./data"), converter=Path)
    plugins: tuple[str, ...] = DEFAULT_PLUGINS
    plugin_options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    store_host: str = "127.0.0.1:10911"
    default_queue_count: int = 4
    auto_create_topic: bool = True
    max_message_size: int = DEFAULT_MAX_BODY_SIZE
    max_reconsume_times: int = 16
    heartbeat_timeout_s: float = 120.0
    source: str = "<mapping>"


_BROKER_KEYS = {f.name for f in attrs.fields(BrokerConfig)} - {"plugin_options", "source"}


def _expect(path: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {what}, got {value!r}")
    return value


def _broker_table(table: Mapping[str, Any], source: str, base_dir: Path | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{source}: broker.{key}"
        if key not in _BROKER_KEYS:
            close = difflib.get_close_matches(key, sorted(_BROKER_KEYS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}: unknown key.{hint} Known keys: {', '.join(sorted(_BROKER_KEYS))}")
        if key == "name":
            try:
                validate_topic(_expect(path, value, str, "a string"))
            except InvalidNameError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
        elif key == "data_dir":
            value = Path(_expect(path, value, (str, os.PathLike), "a path"))
            if base_dir is not None and not value.is_absolute():
                value = base_dir / value
        elif key == "plugins":
            _expect(path, value, list, "a list of plugin names")
            for i, item in enumerate(value):
                _expect(f"{path}[{i}]", item, str, "a plugin name (string)")
            value = tuple(value)
        elif key == "store_host":
            try:
                _host_bytes(_expect(path, value, str, "'IPv4:port'"))
            except ValueError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
        elif key in ("default_queue_count", "max_message_size", "max_reconsume_times"):
            if _expect(path, value, int, "an integer") < (0 if key == "max_reconsume_times" else 1):
                raise ConfigError(f"{path} must be >= {0 if key == 'max_reconsume_times' else 1}, got {value}")
        elif key == "auto_create_topic":
            _expect(path, value, bool, "true or false")
        elif key == "heartbeat_timeout_s":
            if _expect(path, value, (int, float), "a number of seconds") <= 0:
                raise ConfigError(f"{path} must be > 0, got {value}")
            value = float(value)
        values[key] = value
    return values


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> BrokerConfig:
    """Read and validate a broker config from a TOML file path or an equivalent mapping.

    Relative ``data_dir`` values in a file are taken relative to the file's directory.
    """
    base_dir: Path | None = None
    if isinstance(source, Mapping):
        raw: Mapping[str, Any] = source
        name = "<mapping>"
    else:
        path = Path(source)
        name = str(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {name} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{name}: not valid TOML: {exc}") from exc
        base_dir = path.resolve().parent
    for key in raw:
        # [server] belongs to `plugmq serve`, which validates it; the broker itself ignores it.
        if key not in ("broker", "plugins", "server"):
            raise ConfigError(f"{name}: unknown top-level table [{key}]; a config has [broker], "
                              "[plugins.<name>] and (for plugmq serve) [server]")
    broker = raw.get("broker", {})
    _expect(f"{name}: [broker]", broker, Mapping, "a table")
    values = _broker_table(broker, name, base_dir)
    plugin_tables = raw.get("plugins", {})
    _expect(f"{name}: [plugins]", plugin_tables, Mapping, "a table of plugin tables")
    options: dict[str, Mapping[str, Any]] = {}
    for plugin, table in plugin_tables.items():
        _expect(f"{name}: plugins.{plugin}", table, Mapping, "a table of options")
        options[plugin] = dict(table)
    plugins = values.get("plugins", DEFAULT_PLUGINS)
    for plugin in options:
        if plugin not in plugins:
            raise ConfigError(
                f"{name}: [plugins.{plugin}] configures a plugin that broker.plugins does not list "
                f"({', '.join(plugins)}); add it to the list or remove the table"
            )
    return BrokerConfig(plugin_options=options, source=name, **values)
