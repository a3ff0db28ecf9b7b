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

Every table has a schema (BrokerConfig is ``[broker]``'s; :mod:`plugmq.config.reference` prints them
all) checked by one engine (:mod:`plugmq.core.schema`): a bad file is one ConfigError listing every
problem, each naming the key path (``broker.plugins[2]``), the value and the fix.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import attrs

from plugmq.config.datadir import data_dir_value_problem
from plugmq.config.limits import RateLimits, parse_limits_table
from plugmq.config.policy import GroupPolicies, GroupPolicy, parse_groups_table
from plugmq.config.topics import TopicSettingsTable, parse_topics_table
from plugmq.core.errors import ConfigError
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE, _host_bytes
from plugmq.core.names import validate_broker_name, validate_cluster_name, validate_room
from plugmq.core.schema import (
    Expect,
    Mismatch,
    Problems,
    Refusal,
    above,
    at_least,
    calls,
    dotted,
    internal,
    one_of,
    setting,
)

__all__ = ["DEFAULT_PLUGINS", "BrokerConfig", "ClusterTable", "ConfigFile", "OldBrokerKeys", "OldServerKeys",
           "check_moved_server_keys", "listed_plugins", "load_config", "read_toml"]

#: The documented default plugin set, used when a config names no plugins.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "store_mmap",
    "delay_wheel",
    "filter_tag",
    "filter_sql",
    "alloc",
    "txn",
)
ROLES = ("async_master", "sync_master", "slave")


def _data_dir(value: Any) -> Path:
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise Mismatch("a path", value)
    problem = data_dir_value_problem(os.fspath(value))
    if problem is not None:
        raise Refusal(problem)
    return Path(value)


def _pop_fsync(default: bool | None) -> Any:
    return setting(default, doc="fsync the pop state (receipts, invisible times) after every change")


def _pop_compact_bytes(default: int | None) -> Any:
    return setting(default, doc="the pop journal is compacted once it grows past this many bytes",
                   validator=attrs.validators.optional(at_least(1)))


@attrs.frozen
class BrokerConfig:
    """The ``[broker]`` table (every key a field) plus what the reader adds (plugins' tables, groups)."""

    name: str = setting("broker-a", doc="the broker's name (RocketMQ brokerName): names its files and znodes",
                        validator=calls(validate_broker_name))
    data_dir: Path = attrs.field(default=Path("./data"), converter=_data_dir, metadata={
        "doc": "the directory of the broker's files (created if missing; relative to the config file)"})
    plugins: tuple[Annotated[str, Expect("a plugin name (string)")], ...] = setting(
        DEFAULT_PLUGINS, doc="the plugins the broker is assembled from (entry points of group plugmq.plugins)",
        expected="a list of plugin names")
    plugin_options: Mapping[str, Mapping[str, Any]] = internal(
        factory=dict, doc="[plugins.<name>] tables, checked against each plugin's options at assembly")
    store_host: str = setting("127.0.0.1:10911", doc="IPv4:port written into message ids (RocketMQ storeHost)",
                              expected="'IPv4:port'", validator=calls(_host_bytes))
    default_queue_count: int = setting(4, doc="queues of an auto-created topic", validator=at_least(1))
    auto_create_topic: bool = setting(True, doc="create a topic on its first send")
    max_message_size: int = setting(DEFAULT_MAX_BODY_SIZE, doc="largest body accepted, in bytes",
                                    validator=at_least(1))
    heartbeat_timeout_s: float = setting(120.0, doc="a client silent this long is dropped from its groups",
                                         expected="a number of seconds", validator=above(0))
    pop_fsync: bool = _pop_fsync(False)
    pop_compact_bytes: int = _pop_compact_bytes(8 << 20)
    groups: GroupPolicies = internal(factory=GroupPolicies, doc="the [groups] table")
    topic_settings: TopicSettingsTable = internal(factory=TopicSettingsTable, doc="the [topics] table")
    limits: RateLimits = internal(factory=RateLimits, doc="the [limits] table")
    room: str = setting("", doc="the broker's machine room (MACHINE_ROOM / MACHINE_ROOM_NEARBY allocation)",
                        validator=calls(lambda room: room and validate_room(room)))
    broker_id: int = setting(0, doc="0 for a master, above 0 for a slave (RocketMQ brokerId)",
                             validator=at_least(0, " (0 for a master, above 0 for a slave)"))
    role: str = setting("async_master", doc="async_master, sync_master (waits for a slave's ack) or slave",
                        validator=one_of(*ROLES))
    failover: bool = setting(False, doc="the cluster plugin elects this broker name's master (role: the mode "
                                        "this broker works in whenever it is master)")
    failover_unclean_after_s: float = setting(
        0.0, doc="0: never. Else a slave that is not caught up may be elected once no master of its name has "
                 "been live this long (RocketMQ 5's enableElectUncleanMaster): acked records it lacks are lost",
        expected="a number of seconds (0: never)",
        validator=at_least(0, " (0: a slave that is not caught up is never elected)"))
    cluster_name: str | None = internal(None, doc="[cluster] name")
    source: str = internal("<mapping>", doc="the file (or '<mapping>') the config was read from")

    def __attrs_post_init__(self) -> None:
        if self.failover_unclean_after_s and not self.failover:
            raise Refusal("applies to elections: it needs failover = true", key="failover_unclean_after_s")
        if self.failover and self.role == "slave":
            raise Refusal("= 'slave' with failover = true: failover elects the master, so role names the mode "
                          "this broker works in whenever it is master: async_master or sync_master", key="role")
        if not self.failover and (self.role == "slave") != (self.broker_id > 0):
            raise Refusal(f"= {self.role!r} with broker_id = {self.broker_id}: a master has broker_id 0 and a "
                          "slave a broker_id above 0; fix one of the two", key="role")


@attrs.frozen
class ClusterTable:
    """``[cluster]``: the cluster a broker joins (through its cluster plugin)."""

    name: str | None = setting(None, doc='required: the cluster\'s name, shared by the brokers of one cluster',
                               validator=attrs.validators.optional(calls(validate_cluster_name)))

    def __attrs_post_init__(self) -> None:
        if self.name is None:
            raise Refusal('has no name; add name = "<cluster>" (the brokers of one cluster share it)')


@attrs.frozen
class OldBrokerKeys:
    """Older spellings in ``[broker]``, still read."""

    max_reconsume_times: int | None = setting(
        None, doc="deprecated: [groups] max_delivery_attempts = max_reconsume_times + 1",
        validator=attrs.validators.optional(at_least(0)))


@attrs.frozen
class OldServerKeys:
    """The keys of ``[server]`` that moved to the broker when pop consumption moved to the core (still read)."""

    pop_fsync: bool | None = _pop_fsync(None)
    pop_compact_bytes: int | None = _pop_compact_bytes(None)
    default_group: Mapping[str, Any] | None = setting(None, doc="deprecated: the [groups] defaults")
    groups: Mapping[str, Any] | None = setting(None, doc="deprecated: [groups.<group>] tables")


@attrs.frozen
class ConfigFile:
    """The tables of a broker config file."""

    broker: Mapping[str, Any] = setting(factory=dict, doc="the broker", expected="a table")
    plugins: Mapping[str, Annotated[Mapping[str, Any], Expect("a table of options")]] = setting(
        factory=dict, doc="[plugins.<name>]: one table of options per plugin listed in broker.plugins",
        expected="a table of tables")
    groups: Mapping[str, Any] = setting(factory=dict, doc="consumer groups' policies", expected="a table")
    topics: Mapping[str, Any] = setting(factory=dict, doc="[topics.<topic>]: dedup window, priority",
                                        expected="a table")
    limits: Mapping[str, Any] = setting(factory=dict, doc="[limits.groups|topics|accounts.<name>]: rate limits",
                                        expected="a table")
    cluster: Mapping[str, Any] | None = setting(None, doc="the cluster a broker joins", expected="a table")
    server: Mapping[str, Any] = setting(factory=dict, doc="plugmq serve's table", expected="a table")


_OLD_BROKER_KEYS = tuple(attrs.fields_dict(OldBrokerKeys))
_MOVED_SERVER_KEYS = tuple(attrs.fields_dict(OldServerKeys))


def read_toml(path: str | os.PathLike[str], what: str = "config file") -> dict[str, Any]:
    """A TOML file's tables; ConfigError when it is missing or not TOML (``what`` names the file's role)."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> BrokerConfig:
    """Read and validate a broker config from a TOML file path or an equivalent mapping.

    Relative ``data_dir`` values in a file are taken relative to the file's directory. A bad
    config raises one ConfigError listing every problem (``problems``: one line each).
    """
    if isinstance(source, Mapping):
        return _config(source, "<mapping>", None)
    return _config(read_toml(source), str(source), Path(source).resolve().parent)


def _config(raw: Mapping[str, Any], name: str, base_dir: Path | None) -> BrokerConfig:
    found = Problems(name, headers=True)
    tables = found.structure(raw, ConfigFile)
    found.raise_any()
    assert tables is not None
    broker = found.structure({k: v for k, v in tables.broker.items() if k not in _OLD_BROKER_KEYS}, BrokerConfig,
                             ("broker",))
    old_broker = found.structure({k: v for k, v in tables.broker.items() if k in _OLD_BROKER_KEYS},
                                 OldBrokerKeys, ("broker",))
    old_server = found.structure({k: v for k, v in tables.server.items() if k in _MOVED_SERVER_KEYS},
                                 OldServerKeys, ("server",))
    cluster = found.structure(tables.cluster, ClusterTable, ("cluster",)) if tables.cluster is not None else None
    groups = _group_policies(tables.groups, old_broker, old_server, found)
    topic_settings, limits = _topics_and_limits(tables, found)
    _check_across_tables(tables, broker, found)
    found.raise_any()
    assert broker is not None and old_server is not None
    moved = {key: getattr(old_server, key) for key in ("pop_fsync", "pop_compact_bytes")
             if getattr(old_server, key) is not None}
    data_dir = broker.data_dir if base_dir is None or broker.data_dir.is_absolute() else base_dir / broker.data_dir
    return attrs.evolve(broker, **moved, data_dir=data_dir, groups=groups, topic_settings=topic_settings,
                        limits=limits, plugin_options=dict(tables.plugins),
                        cluster_name=cluster.name if cluster is not None else None, source=name)


def _topics_and_limits(tables: ConfigFile, found: Problems) -> tuple[TopicSettingsTable, RateLimits]:
    """``[topics]`` and ``[limits]`` (their problems recorded; empty tables in their place)."""
    where = f"{found.source}: " if found.source else ""
    topic_settings, limits = TopicSettingsTable(), RateLimits()
    try:
        topic_settings = parse_topics_table(tables.topics, source=found.source)
    except ConfigError as exc:
        found.extend(exc)
    try:
        limits = parse_limits_table(tables.limits, path=f"{where}limits")
    except ConfigError as exc:
        found.extend(exc)
    return topic_settings, limits


def _check_across_tables(tables: ConfigFile, broker: BrokerConfig | None, found: Problems) -> None:
    """Pop settings written twice (in [broker] and their older place in [server]); plugin tables of
    plugins the broker does not list."""
    for key in ("pop_fsync", "pop_compact_bytes"):
        if key in tables.broker and key in tables.server:
            found.add(f"{key} is set in both [broker] and [server]; pop state belongs to the broker now: keep "
                      f"broker.{key} and remove server.{key}")
    plugins = broker.plugins if broker is not None else listed_plugins(tables.broker)
    for plugin in [p for p in tables.plugins if plugins is not None and p not in plugins]:
        found.add(f"[plugins.{plugin}] configures a plugin that broker.plugins does not list "
                  f"({', '.join(plugins or ())}); add it to the list or remove the table")


def listed_plugins(broker: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The plugin names a ``[broker]`` table lists (the default set when it lists none; entries that
    are no names are left out); None when its ``plugins`` is no list."""
    plugins = broker.get("plugins", DEFAULT_PLUGINS)
    if isinstance(plugins, (list, tuple)):
        return tuple(name for name in plugins if isinstance(name, str))
    return None


def check_moved_server_keys(server: Mapping[str, Any], *, source: str = "<mapping>") -> None:
    """Validate the keys of a ``[server]`` table that moved to the broker (``default_group``,
    ``groups``, ``pop_fsync``, ``pop_compact_bytes``): `plugmq serve` reports their errors first."""
    found = Problems(source)
    old_server = found.structure({k: v for k, v in server.items() if k in _MOVED_SERVER_KEYS}, OldServerKeys,
                                 ("server",))
    _group_policies({}, OldBrokerKeys(), old_server, found)
    found.raise_any()


def _older_group_settings(old_broker: OldBrokerKeys | None, old_server: OldServerKeys | None,
                          found: Problems) -> tuple[dict[str, Any], dict[str, str]]:
    """The groups' settings written in their older places, and where each one was written.

    Each older table is checked where it is written, so its errors name the older path.
    """
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if old_broker is not None and old_broker.max_reconsume_times is not None:
        merged["max_delivery_attempts"] = old_broker.max_reconsume_times + 1
        origin["max_delivery_attempts"] = "broker.max_reconsume_times"
    if old_server is None:
        return merged, origin
    default_group = dict(old_server.default_group or {})
    for key in [k for k, v in default_group.items() if isinstance(v, Mapping)]:
        found.add_at(("server", "default_group", key), "must be a value, not a table")
        del default_group[key]
    for path, table in ((("server", "default_group"), default_group), (("server", "groups"), old_server.groups or {})):
        try:
            parse_groups_table(table, source=found.source, path=path)
        except ConfigError as exc:
            found.extend(exc)
            continue
        for key, value in table.items():
            label = f"server.groups.{key}" if path[-1] == "groups" else "server.default_group"
            if key in merged:
                found.add(f"{key!r} is set by both {origin[key]} and {dotted(path)}; write it once, in [groups]")
            else:
                merged[key], origin[key] = value, label
    return merged, origin


def _group_policies(groups: Mapping[str, Any], old_broker: OldBrokerKeys | None, old_server: OldServerKeys | None,
                    found: Problems) -> GroupPolicies:
    """``[groups]``, merged with the older spellings of the same settings.

    ``[broker] max_reconsume_times = n`` means ``[groups] max_delivery_attempts = n + 1``;
    ``[server.default_group]`` and ``[server.groups.<g>]`` mean ``[groups]`` and ``[groups.<g>]``.
    A setting written in both places is refused (it could only disagree).
    """
    merged, origin = _older_group_settings(old_broker, old_server, found)
    for key, value in groups.items():
        if key in merged:
            where = f"[groups.{key}]" if isinstance(value, (Mapping, GroupPolicy)) else f"groups.{key}"
            found.add(f"{where} is also set by {origin[key]}, its older spelling; keep {where} and remove the other")
        merged[key] = value
    try:
        return parse_groups_table(merged, source=found.source)
    except ConfigError as exc:
        found.extend(exc)
        return GroupPolicies()
