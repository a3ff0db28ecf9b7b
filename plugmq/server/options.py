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

    [server.acl]                    # off unless enabled
    enabled = true
    [server.acl.accounts.app1]      # the access key
    secret = "s3cret"
    publish = ["orders"]            # topics this key may send to ("*" = all)
    subscribe = ["*"]               # topics this key may receive from
    admin = false                   # may use the admin endpoint (plugmq admin --server)

``plugmq serve`` reads the table from the broker's TOML file and hands the rest to the broker.
Older configs kept group policies and the pop-state settings here (``[server.default_group]``,
``[server.groups.<g>]``, ``pop_fsync``, ``pop_compact_bytes``); they are still read, by the broker
(plugmq.config.broker), which owns pop consumption now.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.config.broker import check_moved_server_keys
from plugmq.core.errors import ConfigError

__all__ = ["Account", "AclOptions", "ServerOptions", "load_serve_config", "parse_server_table"]

# Keys of [server] that belong to the broker now (read by plugmq.config.broker.load_config).
_BROKER_OWNED = ("groups", "default_group", "pop_fsync", "pop_compact_bytes")


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"server.{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen
class Account:
    """One access key: its secret and the topics it may publish to and subscribe to."""

    access_key: str
    secret: str
    publish: frozenset[str] = frozenset()
    subscribe: frozenset[str] = frozenset()
    admin: bool = False

    def may(self, action: str, topic: str) -> bool:
        allowed = self.publish if action == "publish" else self.subscribe
        return "*" in allowed or topic in allowed


@attrs.frozen
class AclOptions:
    enabled: bool = False
    accounts: Mapping[str, Account] = attrs.field(factory=dict)


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
}
_TABLES = ("acl",)
_ACCOUNT_KEYS = ("secret", "publish", "subscribe", "admin")


def _unknown(path: str, key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{path}.{key}: unknown key.{hint} Known keys: {', '.join(sorted(known))}")


def _expect(path: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or (
            isinstance(kind, tuple) and bool not in kind and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {what}, got {value!r}")
    return value


def _topics(path: str, value: Any) -> frozenset[str]:
    _expect(path, value, list, 'a list of topic names ("*" for every topic)')
    for i, item in enumerate(value):
        _expect(f"{path}[{i}]", item, str, "a topic name")
    return frozenset(value)


def _acl(path: str, table: Any) -> AclOptions:
    _expect(path, table, Mapping, "a table")
    enabled = False
    accounts: dict[str, Account] = {}
    for key, value in table.items():
        if key == "enabled":
            enabled = _expect(f"{path}.enabled", value, bool, "true or false")
        elif key == "accounts":
            _expect(f"{path}.accounts", value, Mapping, "a table of access keys")
            for access_key, entry in value.items():
                where = f"{path}.accounts.{access_key}"
                _expect(where, entry, Mapping, "a table with secret, publish and subscribe")
                for field in entry:
                    if field not in _ACCOUNT_KEYS:
                        raise _unknown(where, field, list(_ACCOUNT_KEYS))
                secret = _expect(f"{where}.secret", entry.get("secret"), str, "the account's secret key (a string)")
                if not secret:
                    raise ConfigError(f"{where}.secret is empty; give the secret key clients sign with")
                accounts[access_key] = Account(access_key, secret,
                                               _topics(f"{where}.publish", entry.get("publish", [])),
                                               _topics(f"{where}.subscribe", entry.get("subscribe", [])),
                                               _expect(f"{where}.admin", entry.get("admin", False), bool,
                                                       "true or false"))
        else:
            raise _unknown(path, key, ["enabled", "accounts"])
    if enabled and not accounts:
        raise ConfigError(f"{path}.enabled is true but no account is configured; add [{path}.accounts.<access-key>] "
                          "with a secret, or set enabled = false")
    return AclOptions(enabled, accounts)


def parse_server_table(table: Mapping[str, Any], *, source: str = "<mapping>") -> ServerOptions:
    """Validate a ``[server]`` table into ServerOptions; errors name the key path and the fix."""
    path = f"{source}: server"
    _expect(path, table, Mapping, "a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in _SCALARS:
            kind, what = _SCALARS[key]
            values[key] = _expect(f"{path}.{key}", value, kind, what)
        elif key not in _TABLES and key not in _BROKER_OWNED:
            raise _unknown(path, key, [*_SCALARS, *_TABLES])
    check_moved_server_keys(table, source=source)  # read by the broker; checked here so errors come first
    acl = _acl(f"{path}.acl", table.get("acl", {}))
    try:
        options = ServerOptions(**values, acl=acl)
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
    server = parse_server_table(table, source=str(file))
    if isinstance(table, Mapping) and any(key in table for key in _BROKER_OWNED):
        raw["server"] = {key: table[key] for key in _BROKER_OWNED if key in table}  # the broker reads these
    broker = dict(raw.get("broker", {}))
    data_dir = broker.get("data_dir")
    if isinstance(data_dir, str) and not Path(data_dir).is_absolute():
        broker["data_dir"] = str(file.resolve().parent / data_dir)
    raw["broker"] = broker
    return raw, server
