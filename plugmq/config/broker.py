"""Broker configuration: a TOML file or a mapping, validated into a frozen BrokerConfig.

::

    [broker]
    name = "broker-a"
    data_dir = "./data"
    plugins = ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "alloc"]

    [plugins.store_mmap]
    flush = "sync"

    [groups]                        # consumer groups' redelivery policy (plugmq.config.policy)
    max_delivery_attempts = 17
    [groups.orders]
    fifo = true

A broker in a cluster also names the cluster and a cluster plugin (see ``plugmq.plugins.cluster_zk``)::

    [broker]
    name = "broker-a"
    room = "east"                   # its machine room (MACHINE_ROOM / MACHINE_ROOM_NEARBY allocation)
    plugins = ["store_mmap", "delay_wheel", "filter_tag", "filter_sql", "alloc", "txn", "cluster_zk"]

    [cluster]
    name = "prod"

    [plugins.cluster_zk]
    hosts = "127.0.0.1:2181"

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

from plugmq.config.datadir import check_data_dir_value
from plugmq.config.policy import GroupPolicies, parse_groups_table
from plugmq.core.errors import ConfigError, InvalidNameError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE, _host_bytes
from plugmq.core.names import validate_broker_name, validate_cluster_name, validate_room

__all__ = ["DEFAULT_PLUGINS", "BrokerConfig", "check_moved_server_keys", "load_config"]

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
    heartbeat_timeout_s: float = 120.0
    pop_fsync: bool = False
    pop_compact_bytes: int = 8 << 20
    groups: GroupPolicies = attrs.field(factory=GroupPolicies)
    room: str = ""
    broker_id: int = 0
    role: str = "async_master"
    failover: bool = False
    # 0: never. Else a slave that is not caught up may be elected once no master of its name has
    # been live this long (RocketMQ 5's enableElectUncleanMaster): acked records it lacks are lost.
    failover_unclean_after_s: float = 0.0
    cluster_name: str | None = None
    source: str = "<mapping>"


_BROKER_KEYS = {f.name for f in attrs.fields(BrokerConfig)} - {"plugin_options", "source", "groups", "cluster_name"}
# Older spellings, still read: [broker] max_reconsume_times (the groups' default attempts - 1),
# and in [server] the tables and keys that moved to the broker when pop consumption moved to the core.
_OLD_BROKER_KEYS = {"max_reconsume_times"}
_OLD_SERVER_KEYS = ("groups", "default_group", "pop_fsync", "pop_compact_bytes")
_ROLES = ("async_master", "sync_master", "slave")
_CLUSTER_KEYS = ("name",)


def _expect(path: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {what}, got {value!r}")
    return value


def _broker_table(table: Mapping[str, Any], source: str, base_dir: Path | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{source}: broker.{key}"
        if key in _OLD_BROKER_KEYS:
            continue  # read by _group_policies
        if key not in _BROKER_KEYS:
            close = difflib.get_close_matches(key, sorted(_BROKER_KEYS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}: unknown key.{hint} Known keys: {', '.join(sorted(_BROKER_KEYS))}")
        if key == "name":
            try:
                validate_broker_name(_expect(path, value, str, "a string"))
            except InvalidNameError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
        elif key == "room":
            try:
                validate_room(_expect(path, value, str, "a string"))
            except InvalidNameError as exc:
                raise ConfigError(f"{path}: {exc}") from exc
        elif key == "broker_id":
            if _expect(path, value, int, "an integer (0 for a master, above 0 for a slave)") < 0:
                raise ConfigError(f"{path} must be >= 0 (0 for a master, above 0 for a slave), got {value}")
        elif key == "role":
            if _expect(path, value, str, "a string") not in _ROLES:
                raise ConfigError(f"{path} must be one of {', '.join(_ROLES)}, got {value!r}")
        elif key == "data_dir":
            value = check_data_dir_value(_expect(path, value, (str, os.PathLike), "a path"), source)
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
        elif key in ("default_queue_count", "max_message_size", "pop_compact_bytes"):
            if _expect(path, value, int, "an integer") < 1:
                raise ConfigError(f"{path} must be >= 1, got {value}")
        elif key in ("auto_create_topic", "pop_fsync", "failover"):
            _expect(path, value, bool, "true or false")
        elif key == "heartbeat_timeout_s":
            if _expect(path, value, (int, float), "a number of seconds") <= 0:
                raise ConfigError(f"{path} must be > 0, got {value}")
            value = float(value)
        elif key == "failover_unclean_after_s":
            if _expect(path, value, (int, float), "a number of seconds (0: never)") < 0:
                raise ConfigError(f"{path} must be >= 0 (0: a slave that is not caught up is never elected), "
                                  f"got {value}")
            value = float(value)
        values[key] = value
    role, broker_id = values.get("role", "async_master"), values.get("broker_id", 0)
    if values.get("failover_unclean_after_s") and not values.get("failover"):
        raise ConfigError(f"{source}: broker.failover_unclean_after_s applies to elections: it needs "
                          "broker.failover = true")
    if values.get("failover"):
        if role == "slave":
            raise ConfigError(f"{source}: broker.failover = true elects the master, so broker.role names the mode "
                              "this broker works in whenever it is master: async_master or sync_master, not 'slave'")
    elif (role == "slave") != (broker_id > 0):
        raise ConfigError(f"{source}: broker.role = {role!r} with broker.broker_id = {broker_id}: a master has "
                          "broker_id 0 and a slave a broker_id above 0; fix one of the two")
    return values


def _cluster_table(table: Any, source: str) -> str:
    _expect(f"{source}: [cluster]", table, Mapping, "a table")
    for key in table:
        if key not in _CLUSTER_KEYS:
            raise ConfigError(f"{source}: cluster.{key}: unknown key. Known keys: {', '.join(_CLUSTER_KEYS)}")
    if "name" not in table:
        raise ConfigError(f'{source}: [cluster] has no name; add name = "<cluster>" (the brokers of one cluster '
                          "share it)")
    name = _expect(f"{source}: cluster.name", table["name"], str, "a string")
    try:
        return validate_cluster_name(name)
    except InvalidNameError as exc:
        raise ConfigError(f"{source}: cluster.name: {exc}") from exc


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
        # [server] belongs to `plugmq serve`, which validates it; the broker reads only the keys
        # that moved from there to the broker (_OLD_SERVER_KEYS).
        if key not in ("broker", "plugins", "groups", "server", "cluster"):
            raise ConfigError(f"{name}: unknown top-level table [{key}]; a config has [broker], "
                              "[plugins.<name>], [groups], (for a cluster) [cluster] and (for plugmq serve) [server]")
    broker = raw.get("broker", {})
    _expect(f"{name}: [broker]", broker, Mapping, "a table")
    server = raw.get("server", {})
    _expect(f"{name}: [server]", server, Mapping, "a table")
    values = _broker_table(broker, name, base_dir)
    for key, value in _moved_pop_settings(server, name).items():
        if key in values:
            raise ConfigError(f"{name}: {key} is set in both [broker] and [server]; pop state belongs "
                              f"to the broker now: keep broker.{key} and remove server.{key}")
        values[key] = value
    values["groups"] = _group_policies(raw.get("groups", {}), broker, server, name)
    if "cluster" in raw:
        values["cluster_name"] = _cluster_table(raw["cluster"], name)
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


def check_moved_server_keys(server: Mapping[str, Any], *, source: str = "<mapping>") -> None:
    """Validate the keys of a ``[server]`` table that moved to the broker (``default_group``,
    ``groups``, ``pop_fsync``, ``pop_compact_bytes``): `plugmq serve` reports their errors first."""
    _moved_pop_settings(server, source)
    _group_policies({}, {}, server, source)


def _moved_pop_settings(server: Mapping[str, Any], name: str) -> dict[str, Any]:
    moved = {key: server[key] for key in ("pop_fsync", "pop_compact_bytes") if key in server}
    try:
        return _broker_table(moved, name, None)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"{name}: broker.", f"{name}: server.", 1)) from None


def _group_policies(groups: Any, broker: Mapping[str, Any], server: Mapping[str, Any], name: str) -> GroupPolicies:
    """``[groups]``, merged with the older spellings of the same settings.

    ``[broker] max_reconsume_times = n`` means ``[groups] max_delivery_attempts = n + 1``;
    ``[server.default_group]`` and ``[server.groups.<g>]`` mean ``[groups]`` and ``[groups.<g>]``.
    A setting written in both places is refused (it could only disagree).
    """
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if "max_reconsume_times" in broker:
        times = broker["max_reconsume_times"]
        path = f"{name}: broker.max_reconsume_times"
        if _expect(path, times, int, "an integer") < 0:
            raise ConfigError(f"{path} must be >= 0, got {times}")
        merged["max_delivery_attempts"] = times + 1
        origin["max_delivery_attempts"] = "broker.max_reconsume_times"
    for table_name, what in (("default_group", "server.default_group"), ("groups", "server.groups")):
        table = server.get(table_name, {})
        parse_groups_table(table, path=f"{name}: {what}")  # errors name the old path
        for key, value in table.items():
            if table_name == "default_group" and isinstance(value, Mapping):
                raise ConfigError(f"{name}: {what}.{key} must be a value, not a table")
            if key in merged:
                raise ConfigError(f"{name}: {key!r} is set by both {origin[key]} and {what}; write it once, "
                                  f"in [groups]")
            merged[key] = value
            origin[key] = f"{what}.{key}" if table_name == "groups" else what
    if not isinstance(groups, Mapping):
        raise ConfigError(f"{name}: [groups] must be a table, got {groups!r}")
    for key, value in groups.items():
        if key in merged:
            where = f"[groups.{key}]" if isinstance(value, Mapping) else f"groups.{key}"
            raise ConfigError(f"{name}: {where} is also set by {origin[key]}, its older spelling; keep "
                              f"{where} and remove the other")
        merged[key] = value
    return parse_groups_table(merged, path=f"{name}: groups")
