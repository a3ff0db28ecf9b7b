"""Open one family's component from one plugin, outside a broker (conformance suite, benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts import (
    DelayContext,
    DelayScheduler,
    Deliver,
    DeliverBatch,
    Family,
    MessageStore,
    PluginContext,
    WasDelivered,
)
from plugmq.core.errors import PluginError
from plugmq.core.pluginmanager import LoadedPlugins, build_options, load_plugins
from plugmq.core.retention import RetentionFloor

__all__ = ["open_delay_scheduler", "open_store", "plugin_declaration"]


def _single(plugin: str, family: Family, objects: Mapping[str, object] | None) -> LoadedPlugins:
    loaded = load_plugins([plugin], objects=objects, check_cardinality=False, config_path=f"plugin {plugin!r}")
    if family not in loaded.declarations[plugin].families:
        raise PluginError(f"plugin {plugin!r} does not declare the {family.value} family")
    return loaded


def plugin_declaration(plugin: str, objects: Mapping[str, object] | None = None):
    """The declaration of one installed plugin."""
    return load_plugins([plugin], objects=objects, check_cardinality=False).declarations[plugin]


def _context_args(loaded: LoadedPlugins, plugin: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    built = build_options(loaded.declarations[plugin], options, config_path=f"plugins.{plugin}")
    return {"options": {plugin: built}}


def open_store(
    plugin: str,
    data_dir: Path,
    *,
    clock: Clock | None = None,
    options: Mapping[str, Any] | None = None,
    store_host: str = "127.0.0.1:10911",
    broker_name: str = "broker-a",
    objects: Mapping[str, object] | None = None,
    retention: RetentionFloor | None = None,
) -> MessageStore:
    """Open (or recover) a store from the named storage plugin in ``data_dir``; ``retention`` is
    the floor its retention must not clean below (None: nothing is held)."""
    loaded = _single(plugin, Family.STORAGE, objects)
    context = PluginContext(
        broker_name=broker_name, data_dir=Path(data_dir), clock=clock or SystemClock(),
        store_host=store_host, retention=retention, **_context_args(loaded, plugin, options),
    )
    store = loaded.hooks.make_store(context)
    if store is None:
        raise PluginError(f"plugin {plugin!r} declares storage but returned no store")
    return store


def open_delay_scheduler(
    plugin: str,
    data_dir: Path,
    *,
    deliver: Deliver,
    clock: Clock,
    store: MessageStore | None = None,
    was_delivered: WasDelivered | None = None,
    deliver_batch: DeliverBatch | None = None,
    options: Mapping[str, Any] | None = None,
    store_host: str = "127.0.0.1:10911",
    broker_name: str = "broker-a",
    objects: Mapping[str, object] | None = None,
) -> DelayScheduler:
    """Build a delay scheduler from the named delay plugin (not started: call ``start()``)."""
    loaded = _single(plugin, Family.DELAY, objects)
    context = DelayContext(
        broker_name=broker_name, data_dir=Path(data_dir), clock=clock, store_host=store_host,
        store=store, deliver=deliver, was_delivered=was_delivered, deliver_batch=deliver_batch,
        **_context_args(loaded, plugin, options),
    )
    scheduler = loaded.hooks.make_delay_scheduler(context)
    if scheduler is None:
        raise PluginError(f"plugin {plugin!r} declares delay but returned no scheduler")
    return scheduler
