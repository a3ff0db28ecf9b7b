"""The ``[server]`` table of a broker config: listen address, receive limits, access control.

::

    [server]
    listen = "127.0.0.1:8081"
    metrics_listen = "127.0.0.1:5557"   # Prometheus text at /metrics (off when absent)
    min_invisible_s = 1

    [groups.orders]                 # consumer groups are the broker's (plugmq.config.policy), not [server]'s
    fifo = true
    max_delivery_attempts = 5
    backoff_s = [1, 5, 30]

    [server.acl]                    # off unless enabled (plugmq.server.acl)
    enabled = true
    [server.acl.accounts.app1]      # the access key
    secret = "s3cret"
    publish = ["orders"]            # topics this key may send to ("*" = all)
    subscribe = ["*"]               # topics this key may receive from
    groups = ["orders-app1"]        # consumer groups this key may consume as
    admin = false                   # may use the admin endpoint (plugmq admin --server)

    [server.tls]                    # TLS on the gRPC port (and metrics) (plugmq.server.tls)
    cert = "server.pem"
    key = "server.key"

``plugmq serve`` reads the table from the broker's TOML file and hands the rest to the broker.
Older configs kept group policies and the pop-state settings here (``[server.default_group]``,
``[server.groups.<g>]``, ``pop_fsync``, ``pop_compact_bytes``); they are still read, by the broker
(plugmq.config.broker), which owns pop consumption now.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.config.broker import check_moved_server_keys
from plugmq.core.errors import ConfigError
from plugmq.server.acl import Account, AclOptions, expect, parse_acl_table, unknown_key
from plugmq.server.tls import TlsOptions, parse_tls_table

__all__ = ["Account", "AclOptions", "ServerOptions", "load_serve_config", "parse_server_table"]

# Keys of [server] that belong to the broker now (read by plugmq.config.broker.load_config).
_BROKER_OWNED = ("groups", "default_group", "pop_fsync", "pop_compact_bytes")


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"server.{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen
class ServerOptions:
    """How ``plugmq serve`` serves: every key of ``[server]`` is a field.

    ``advertise``: the endpoint routes point clients to (default: the address they connected to).
    ``long_polling_s``: a receive waits this long at most for messages (also capped by the call's
    deadline). ``min_invisible_s`` / ``max_invisible_s``: accepted invisible durations;
    ``default_invisible_s``: used when a receive names none (push consumers' auto-renew mode).
    ``new_group_from``: where a group's first receive starts on a queue ("first" keeps every
    stored message, "last" only new ones). ``metrics_listen``: ``host:port`` of the Prometheus
    endpoint (``/metrics``; port 0 picks a free one, logged as "metrics served"); None: no metrics. Group policies and the pop state are the broker's
    (``[groups]``, ``broker.pop_fsync``, ``broker.pop_compact_bytes``).
    """

    listen: str = "127.0.0.1:8081"
    advertise: str | None = None
    long_polling_s: float = attrs.field(default=20.0, validator=_positive)
    min_invisible_s: float = attrs.field(default=1.0, validator=_positive)
    max_invisible_s: float = attrs.field(default=43_200.0, validator=_positive)
    default_invisible_s: float = attrs.field(default=60.0, validator=_positive)
    max_batch: int = attrs.field(default=32, validator=_positive)
    new_group_from: str = attrs.field(default="first")
    executor_threads: int = attrs.field(default=8, validator=_positive)
    shutdown_grace_s: float = attrs.field(default=5.0, validator=_positive)
    acl: AclOptions = attrs.field(factory=AclOptions)
    metrics_listen: str | None = attrs.field(default=None)
    tls: TlsOptions | None = None
    max_long_polls: int = attrs.field(default=10_000, validator=_positive)
    filter_cache_bytes: int = attrs.field(default=64 << 20, validator=_positive)

    @metrics_listen.validator
    def _check_metrics(self, _attribute: object, value: str | None) -> None:
        if value is None:
            return
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"server.metrics_listen must be 'host:port' (port 0 picks a free one), got {value!r}")

    @new_group_from.validator
    def _check_from(self, _attribute: object, value: str) -> None:
        if value not in ("first", "last"):
            raise ConfigError(f"server.new_group_from must be 'first' or 'last', got {value!r}")


_SCALARS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "listen": (str, "'host:port'"),
    "advertise": (str, "'host:port'"),
    "long_polling_s": ((int, float), "a number of seconds"),
    "min_invisible_s": ((int, float), "a number of seconds"),
    "max_invisible_s": ((int, float), "a number of seconds"),
    "default_invisible_s": ((int, float), "a number of seconds"),
    "max_batch": (int, "an integer"),
    "new_group_from": (str, "'first' or 'last'"),
    "executor_threads": (int, "an integer"),
    "shutdown_grace_s": ((int, float), "a number of seconds"),
    "metrics_listen": (str, "'host:port' of the Prometheus endpoint"),
    "max_long_polls": (int, "an integer (receives waiting at once; more are answered TOO_MANY_REQUESTS)"),
    "filter_cache_bytes": (int, "an integer (bytes of compiled subscriptions kept)"),
}
_TABLES = ("acl", "tls")


def parse_server_table(table: Mapping[str, Any], *, source: str = "<mapping>",
                       config_file: Path | None = None) -> ServerOptions:
    """Validate a ``[server]`` table into ServerOptions; errors name the key path and the fix.

    ``config_file``: the file the table came from; TLS files and the accounts file are relative
    to its directory, and the accounts are reloaded from it."""
    path = f"{source}: server"
    expect(path, table, Mapping, "a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in _SCALARS:
            kind, what = _SCALARS[key]
            values[key] = expect(f"{path}.{key}", value, kind, what)
        elif key not in _TABLES and key not in _BROKER_OWNED:
            raise unknown_key(path, key, [*_SCALARS, *_TABLES])
    check_moved_server_keys(table, source=source)  # read by the broker; checked here so errors come first
    acl = parse_acl_table(f"{path}.acl", table.get("acl", {}), config_file=config_file)
    tls = (parse_tls_table(table["tls"], where=f"{path}.tls",
                           base=config_file.resolve().parent if config_file is not None else None)
           if "tls" in table else None)
    try:
        options = ServerOptions(**values, acl=acl, tls=tls)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    if options.min_invisible_s > options.max_invisible_s:
        raise ConfigError(f"{path}: min_invisible_s ({options.min_invisible_s}) is above max_invisible_s "
                          f"({options.max_invisible_s})")
    return options


def load_serve_config(path: str | Path) -> tuple[dict[str, Any], ServerOptions]:
    """Read a broker TOML file: the broker's part (for ``load_config``) and the ``[server]`` options.

    A relative ``broker.data_dir`` is made relative to the file's directory, as ``load_config``
    does for files.
    """
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {file} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    table = raw.pop("server", {})
    server = parse_server_table(table, source=str(file), config_file=file)
    if isinstance(table, Mapping) and any(key in table for key in _BROKER_OWNED):
        raw["server"] = {key: table[key] for key in _BROKER_OWNED if key in table}  # the broker reads these
    broker = dict(raw.get("broker", {}))
    data_dir = broker.get("data_dir")
    if isinstance(data_dir, str) and not Path(data_dir).is_absolute():
        broker["data_dir"] = str(file.resolve().parent / data_dir)
    raw["broker"] = broker
    return raw, server
