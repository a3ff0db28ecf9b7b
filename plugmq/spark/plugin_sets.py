"""A plugin set of an experiments file checked against the plugins it names.

The table's shape is checked by the engine (:class:`plugmq.spark.experiments.PluginSetTable`); what
depends on the plugins is checked here: they load and hold exactly one store, whose ``flush`` is
stated; every plugin's options fit its declared class; the ``broker`` table is a broker the runner
can start (the keys it sets itself are refused); the allocation strategy is offered and takes its
parameters; ``server`` is a ``[server]`` table ``plugmq serve`` accepts. Every problem is recorded.
"""

from __future__ import annotations

from typing import Any

from plugmq.config.broker import BrokerConfig
from plugmq.core import Family
from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.core.pluginmanager import LoadedPlugins, build_options, load_plugins
from plugmq.core.schema import Problems, dotted
from plugmq.spark.experiments import PluginSet, PluginSetTable
from plugmq.spark.workload_tables import FLUSH_MODES

__all__ = ["check_plugin_set"]

# Broker keys the experiment runner sets for every broker it starts.
_RUNNER_KEYS = ("name", "data_dir", "plugins", "broker_id")


def check_plugin_set(name: str, table: PluginSetTable, found: Problems) -> PluginSet | None:
    """The plugin set ``[plugin_sets.<name>]`` describes; None (its problems recorded) if it has any."""
    path = ("plugin_sets", name)
    before = len(found.lines)
    try:
        loaded = load_plugins(table.plugins, config_path=dotted((*path, "plugins")))
    except PlugmqError as exc:
        text = str(exc)
        found.add(text if dotted((*path, "plugins")) in text else f"{dotted((*path, 'plugins'))}: {text}")
        return None
    stores = loaded.with_family(Family.STORAGE)
    if len(stores) != 1:
        found.add_at((*path, "plugins"), f"a plugin set needs exactly one storage plugin, got {stores or 'none'}",
                     colon=True)
        return None
    flush = _check_options(table, loaded, stores[0], path, found)
    replication = _check_broker(table, loaded, path, found)
    _check_allocation(table, loaded, path, found)
    _check_server(table, path, found)
    if len(found.lines) > before or flush is None:
        return None
    delays = loaded.with_family(Family.DELAY)
    return PluginSet(
        name=name, plugins=table.plugins, options={k: dict(v) for k, v in table.options.items()}, store=stores[0],
        flush=flush, delay=delays[0] if delays else None, allocation_strategy=table.allocation_strategy,
        allocation_params=dict(table.allocation_params), broker=dict(table.broker), replication=replication,
        role=str(table.broker.get("role", "async_master")), server=dict(table.server),
    )


def _check_options(table: PluginSetTable, loaded: LoadedPlugins, store: str, path: tuple[str, ...],
                   found: Problems) -> str | None:
    """Each plugin's options against its declared class; the store's flush mode, which must be stated."""
    options = (*path, "options")
    for plugin in [p for p in table.options if p not in table.plugins]:
        found.add_at((*options, plugin), f"options for a plugin that is not in this set's plugins "
                     f"({', '.join(table.plugins)})", colon=True)
    flush = table.options.get(store, {}).get("flush")
    if flush is None:
        found.add_at((*options, store, "flush"), "the durability mode must be stated explicitly for every plugin "
                     f"set: add options.{store} = {{ flush = \"sync\" }} (or \"async\")", colon=True)
    elif flush not in FLUSH_MODES:
        found.add_at((*options, store, "flush"), f"must be \"sync\" or \"async\", got {flush!r}")
    for plugin, declaration in loaded.declarations.items():
        given = {k: v for k, v in table.options.get(plugin, {}).items()
                 if (plugin, k) != (store, "flush") or flush in FLUSH_MODES}  # a bad flush is said once, above
        try:
            build_options(declaration, given, config_path=dotted((*options, plugin)))
        except ConfigError as exc:
            found.extend(exc)
    return flush if flush in FLUSH_MODES else None


def _check_broker(table: PluginSetTable, loaded: LoadedPlugins, path: tuple[str, ...],
                  found: Problems) -> str | None:
    """The set's ``broker`` table (a master the runner can start); returns the replication plugin."""
    broker = (*path, "broker")
    for key in [k for k in _RUNNER_KEYS if k in table.broker]:
        found.add_at((*broker, key), "set by the experiment runner, not by a plugin set", colon=True)
    replications = loaded.with_family(Family.REPLICATION)
    replication = replications[0] if replications else None
    role = table.broker.get("role", "async_master")
    if role == "slave":
        found.add_at((*broker, "role"), "a plugin set describes the master; with a replication plugin in the set "
                     "the runner starts its slave itself (same plugins and options, role = \"slave\")", colon=True)
    elif role == "sync_master" and replication is None:
        found.add_at((*broker, "role"), "= \"sync_master\" waits for a slave: add a replication plugin (e.g. \"ha\") "
                     "to plugins, or use role = \"async_master\"")
    else:
        settable = {k: v for k, v in table.broker.items() if k not in _RUNNER_KEYS}
        found.structure(settable, BrokerConfig, broker)
    return replication


def _check_allocation(table: PluginSetTable, loaded: LoadedPlugins, path: tuple[str, ...], found: Problems) -> None:
    strategies = loaded.hooks.allocate_strategies()
    strategy = table.allocation_strategy
    if strategy not in strategies:
        found.add_at((*path, "allocation_strategy"), f"{strategy!r} is not offered by the set's plugins; available: "
                     f"{', '.join(sorted(strategies)) or 'none (add the alloc plugin)'}", colon=True)
        return
    try:
        strategies[strategy](**table.allocation_params)
    except (PlugmqError, TypeError, ValueError) as exc:
        found.add_at((*path, "allocation_params"), str(exc), colon=True)


def _check_server(table: PluginSetTable, path: tuple[str, ...], found: Problems) -> None:
    """``server = {...}``: the ``[server]`` options ``plugmq serve`` gets for served workloads."""
    server: dict[str, Any] = dict(table.server)
    if "listen" in server:
        found.add_at((*path, "server", "listen"), "set by the experiment runner (a free loopback port)", colon=True)
    if not server:
        return
    try:
        from plugmq.server.options import parse_server_table
    except ModuleNotFoundError as exc:
        found.add_at((*path, "server"), f"checking [server] options needs the 'serve' extra ({exc.name} is "
                     "missing): pip install 'plugmq[serve]'", colon=True)
        return
    try:
        parse_server_table(server, source=dotted(path))
    except ConfigError as exc:
        found.extend(exc)
