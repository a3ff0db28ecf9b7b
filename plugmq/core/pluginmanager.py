"""Plugin discovery, loading and checking, and the typed wrapper the core calls hooks through.

There is one way in: every plugin, built-in or third-party, is an entry point in group
``plugmq.plugins``. A broker registers only the plugins its config names; ``plugmq.allocate``,
``plugmq.compile_filter`` and ``plugmq plugins`` look at every installed one.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any

import attrs
import pluggy

from plugmq.core import contracts, hookspecs
from plugmq.core.contracts import Family, PluginDeclaration
from plugmq.core.errors import ConfigError, PluginCardinalityError, PluginError
from plugmq.core.logs import get_logger
from plugmq.core.message import StoredMessage
from plugmq.core.plugin_options import build_plugin_options

__all__ = [
    "ENTRY_POINT_GROUP",
    "EventObservers",
    "Hooks",
    "LoadedPlugins",
    "available_plugins",
    "build_options",
    "installed_allocate_strategies",
    "installed_filter_compilers",
    "installed_plugins",
    "load_plugins",
]

ENTRY_POINT_GROUP = "plugmq.plugins"
log = get_logger(__name__)


def available_plugins() -> dict[str, EntryPoint]:
    """Every installed plugin entry point, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _load_entry_point(name: str, ep: EntryPoint) -> object:
    try:
        return ep.load()
    except Exception as exc:  # a broken third-party plugin must be reported, not crash discovery
        dist = ep.dist.name if ep.dist else "unknown distribution"
        raise PluginError(
            f"plugin {name!r} (entry point {ep.value!r} from {dist}) failed to import: "
            f"{type(exc).__name__}: {exc}. Reinstall or fix that package, or remove it from the plugin list."
        ) from exc


_EVENT_HOOKS = {
    "broker_started": "plugmq_broker_started",
    "broker_stopping": "plugmq_broker_stopping",
    "message_stored": "plugmq_message_stored",
    "message_delivered": "plugmq_message_delivered",
    "message_retried": "plugmq_message_retried",
    "message_dead_lettered": "plugmq_message_dead_lettered",
    "message_acked": "plugmq_message_acked",
    "message_invisible_changed": "plugmq_message_invisible_changed",
    "message_redriven": "plugmq_message_redriven",
}


@attrs.frozen
class EventObservers:
    """Which event hooks at least one registered plugin implements (one flag per event hook).

    The core reads a flag before it does work only an observer needs (reading a stored message
    back, looping over a pulled batch): ``if hooks.observers.message_stored: ...``.
    """

    broker_started: bool = False
    broker_stopping: bool = False
    message_stored: bool = False
    message_delivered: bool = False
    message_retried: bool = False
    message_dead_lettered: bool = False
    message_acked: bool = False
    message_invisible_changed: bool = False
    message_redriven: bool = False

    @property
    def any(self) -> bool:
        return any(attrs.astuple(self))


class _PluginManager(pluggy.PluginManager):
    """A pluggy manager that tells its listeners when plugins come or go.

    Plugins may register after assembly (the gRPC server adds its observer to a running broker);
    the hook wrapper keeps its per-hook flags and cached merges right through this.
    """

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def register(self, plugin: object, name: str | None = None) -> str | None:
        registered = super().register(plugin, name)
        self._changed()
        return registered

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        removed = super().unregister(plugin, name)  # set_blocked unregisters through here too
        self._changed()
        return removed


class Hooks:
    """The typed wrapper over pluggy's hook relay: every hook call of the core goes through here.

    Keyed offers (filter compilers, allocation strategies) are asked once per plugin set and
    cached; registering or unregistering a plugin later drops the cache and re-reads the
    :class:`EventObservers` flags.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._hook = pm.hook
        self._keyed: dict[str, dict[str, Any]] = {}
        self._tracked = isinstance(pm, _PluginManager)
        self._observers = self._read_observers()
        if isinstance(pm, _PluginManager):
            pm.on_change(self._plugins_changed)

    def _plugins_changed(self) -> None:
        self._keyed = {}
        self._observers = self._read_observers()

    def on_plugins_changed(self, listener: Callable[[], None]) -> bool:
        """Call ``listener()`` whenever a plugin comes or goes (after :attr:`observers` is re-read);
        False when this manager does not tell (then read :attr:`observers` every time instead)."""
        if not isinstance(self._pm, _PluginManager):
            return False
        self._pm.on_change(listener)
        return True

    def _read_observers(self) -> EventObservers:
        return EventObservers(**{
            field: bool(getattr(self._hook, hook_name).get_hookimpls()) for field, hook_name in _EVENT_HOOKS.items()
        })

    @property
    def observers(self) -> EventObservers:
        """Per event hook, whether any registered plugin implements it (a cheap read on hot paths)."""
        return self._observers if self._tracked else self._read_observers()

    @property
    def has_observers(self) -> bool:
        """Whether any plugin implements any event hook; prefer the per-hook :attr:`observers`."""
        return self.observers.any

    def _each(self, hook_name: str) -> list[tuple[str, Callable[[], Any]]]:
        caller = getattr(self._hook, hook_name)
        return [(impl.plugin_name, impl.function) for impl in caller.get_hookimpls()]

    def implementers(self, hook_name: str) -> list[str]:
        return [name for name, _ in self._each(hook_name)]

    # declaration --------------------------------------------------------------------------
    def declarations(self) -> dict[str, PluginDeclaration]:
        found: dict[str, PluginDeclaration] = {}
        for plugin_name, function in self._each("plugmq_declare"):
            declaration = function()
            if not isinstance(declaration, PluginDeclaration):
                raise PluginError(
                    f"plugin {plugin_name!r}: plugmq_declare must return a PluginDeclaration, "
                    f"got {type(declaration).__name__}"
                )
            if declaration.name != plugin_name:
                raise PluginError(
                    f"plugin registered as {plugin_name!r} declares the name {declaration.name!r}; "
                    "the declared name must equal the entry-point name"
                )
            found[plugin_name] = declaration
        return found

    def configure(self, context: contracts.PluginContext) -> None:
        self._hook.plugmq_configure(context=context)

    # factories ----------------------------------------------------------------------------
    def make_store(self, context: contracts.PluginContext) -> contracts.MessageStore | None:
        return self._hook.plugmq_make_store(context=context)

    def make_delay_scheduler(self, context: contracts.DelayContext) -> contracts.DelayScheduler | None:
        return self._hook.plugmq_make_delay_scheduler(context=context)

    def make_transaction_service(self, context: contracts.TransactionContext) -> contracts.TransactionService | None:
        return self._hook.plugmq_make_transaction_service(context=context)

    def make_cluster_service(self, context: contracts.ClusterContext) -> contracts.ClusterService | None:
        return self._hook.plugmq_make_cluster_service(context=context)

    def make_replication_service(self, context: contracts.ReplicationContext) -> contracts.ReplicationService | None:
        return self._hook.plugmq_make_replication_service(context=context)

    def filter_compilers(self) -> dict[str, contracts.FilterCompiler]:
        return self._merge_keyed("plugmq_filter_compilers", "filter expression type")

    def allocate_strategies(self) -> dict[str, contracts.AllocateStrategyFactory]:
        return self._merge_keyed("plugmq_allocate_strategies", "allocation strategy")

    def _merge_keyed(self, hook_name: str, what: str) -> dict[str, Any]:
        cached = self._keyed.get(hook_name)
        if cached is not None:
            return dict(cached)
        merged: dict[str, Any] = {}
        owner: dict[str, str] = {}
        for plugin_name, function in self._each(hook_name):
            for key, value in dict(function() or {}).items():
                if key in owner:
                    raise PluginError(
                        f"{what} {key!r} is offered by both {owner[key]!r} and {plugin_name!r}; "
                        "remove one of them from the broker's plugin list"
                    )
                owner[key] = plugin_name
                merged[key] = value
        self._keyed[hook_name] = merged
        return dict(merged)

    # events -------------------------------------------------------------------------------
    def broker_started(self, broker_name: str, system_writer: contracts.SystemTopicWriter) -> None:
        self._hook.plugmq_broker_started(broker_name=broker_name, system_writer=system_writer)

    def broker_stopping(self, broker_name: str) -> None:
        self._hook.plugmq_broker_stopping(broker_name=broker_name)

    def message_stored(self, broker_name: str, message: StoredMessage) -> None:
        self._hook.plugmq_message_stored(broker_name=broker_name, message=message)

    def message_delivered(self, broker_name: str, consumer_group: str, message: StoredMessage,
                          client_id: str, attempt: int) -> None:
        self._hook.plugmq_message_delivered(broker_name=broker_name, consumer_group=consumer_group, message=message,
                                            client_id=client_id, attempt=attempt)

    def message_acked(self, broker_name: str, consumer_group: str, message: StoredMessage, client_id: str) -> None:
        self._hook.plugmq_message_acked(broker_name=broker_name, consumer_group=consumer_group, message=message,
                                        client_id=client_id)

    def message_invisible_changed(self, broker_name: str, consumer_group: str, message: StoredMessage,
                                  client_id: str, invisible_ms: int, gave_up: bool) -> None:
        self._hook.plugmq_message_invisible_changed(broker_name=broker_name, consumer_group=consumer_group,
                                                    message=message, client_id=client_id,
                                                    invisible_ms=invisible_ms, gave_up=gave_up)

    def message_redriven(self, broker_name: str, consumer_group: str, message: StoredMessage, copy_msg_id: str,
                         topic: str) -> None:
        self._hook.plugmq_message_redriven(broker_name=broker_name, consumer_group=consumer_group, message=message,
                                           copy_msg_id=copy_msg_id, topic=topic)

    def message_retried(self, broker_name: str, consumer_group: str, message: StoredMessage, reconsume_times: int) -> None:
        self._hook.plugmq_message_retried(
            broker_name=broker_name, consumer_group=consumer_group, message=message, reconsume_times=reconsume_times
        )

    def message_dead_lettered(self, broker_name: str, consumer_group: str, message: StoredMessage) -> None:
        self._hook.plugmq_message_dead_lettered(broker_name=broker_name, consumer_group=consumer_group, message=message)


@attrs.define
class LoadedPlugins:
    """A checked set of registered plugins: their declarations and the hook wrapper."""

    pm: pluggy.PluginManager
    hooks: Hooks
    declarations: dict[str, PluginDeclaration]

    def with_family(self, family: Family) -> list[str]:
        return [name for name, d in self.declarations.items() if family in d.families]


def _new_manager() -> _PluginManager:
    pm = _PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def load_plugins(
    names: Sequence[str],
    *,
    config_path: str = "broker.plugins",
    objects: Mapping[str, object] | None = None,
    check_cardinality: bool = True,
) -> LoadedPlugins:
    """Register the named plugins (from entry points, or ``objects`` given directly) and check them.

    Raises PluginError naming the plugin, the config path and the fix: unknown name (with a close
    match), import failure, undeclared plugin, hooks that do not exist, cardinality breaches.
    """
    objects = dict(objects or {})
    known = available_plugins()
    pm = _new_manager()
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"{config_path}: plugin {name!r} is listed twice; list each plugin once")
        seen.add(name)
        if name in objects:
            plugin = objects[name]
        elif name in known:
            plugin = _load_entry_point(name, known[name])
        else:
            names_known = sorted(set(known) | set(objects))
            raise PluginError(
                f"{config_path}: unknown plugin {name!r}.{_suggest(name, names_known)} "
                f"Installed plugins: {', '.join(names_known) or 'none'}. "
                "Install the package that provides it (entry-point group 'plugmq.plugins') or fix the name."
            )
        try:
            pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} is invalid: {exc}") from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        unknown = [
            f"{impl.plugin_name}.{hook_name}"
            for hook_name, caller in vars(pm.hook).items()
            if isinstance(caller, pluggy.HookCaller) and not caller.has_spec()
            for impl in caller.get_hookimpls()
        ]
        where = ", ".join(unknown) or str(exc)
        raise PluginError(
            f"{config_path}: a plugin implements a hook that plugmq does not define ({where}). "
            "Check the hook name against plugmq.core.hookspecs (a typo, or a plugin written for "
            "another plugmq version)."
        ) from exc
    hooks = Hooks(pm)
    declarations = hooks.declarations()
    for name in names:
        if name not in declarations:
            raise PluginError(
                f"plugin {name!r} does not implement plugmq_declare; every plugin must declare its "
                "name, families, options and capabilities"
            )
    loaded = LoadedPlugins(pm=pm, hooks=hooks, declarations=declarations)
    if check_cardinality:
        _check_cardinality(loaded, config_path)
    return loaded


def _check_cardinality(loaded: LoadedPlugins, config_path: str) -> None:
    storage = loaded.with_family(Family.STORAGE)
    if not storage:
        installed = _installed_of_family(Family.STORAGE)
        raise PluginCardinalityError(
            f"{config_path}: no storage plugin; a broker needs exactly one. "
            f"Add one of: {', '.join(installed) or 'store_mmap'}"
        )
    for family, limit in ((Family.STORAGE, "exactly one"), (Family.DELAY, "at most one"),
                          (Family.TRANSACTION, "at most one"), (Family.CLUSTER, "at most one"),
                          (Family.REPLICATION, "at most one")):
        members = loaded.with_family(family)
        if len(members) > 1:
            raise PluginCardinalityError(
                f"{config_path}: {len(members)} {family.value} plugins ({', '.join(members)}); "
                f"a broker takes {limit}. Keep one of them in the plugin list."
            )
    # Duplicate keys surface here rather than at first use.
    loaded.hooks.filter_compilers()
    loaded.hooks.allocate_strategies()


def build_options(declaration: PluginDeclaration, table: Mapping[str, Any] | None, *, config_path: str) -> Any:
    """Validate a plugin's config table against its declared options class and build it.

    ConfigError names the plugin, the key, the value and what is expected (see
    :mod:`plugmq.core.plugin_options` for the rules every plugin's options follow).
    """
    return build_plugin_options(declaration.name, declaration.options, table, config_path=config_path)


# -------------------------------------------------------------------------------------------------
# every installed plugin (for plugmq.allocate, plugmq.compile_filter and `plugmq plugins`)
# -------------------------------------------------------------------------------------------------


@attrs.frozen
class InstalledPlugin:
    name: str
    entry_point: EntryPoint
    module: object | None
    declaration: PluginDeclaration | None
    error: str | None

    @property
    def distribution(self) -> str:
        return self.entry_point.dist.name if self.entry_point.dist else "?"

    @property
    def version(self) -> str:
        return self.entry_point.dist.version if self.entry_point.dist else "?"


def installed_plugins() -> list[InstalledPlugin]:
    """Every installed plugin, loaded and declared, or with the error that stopped it."""
    result = []
    for name, ep in sorted(available_plugins().items()):
        try:
            module = _load_entry_point(name, ep)
            declaration = load_plugins([name], objects={name: module}, check_cardinality=False).declarations[name]
            result.append(InstalledPlugin(name, ep, module, declaration, None))
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
            result.append(InstalledPlugin(name, ep, None, None, str(exc)))
    return result


@functools.lru_cache(maxsize=1)
def _installed_loaded() -> LoadedPlugins:
    installed = installed_plugins()
    good = {p.name: p.module for p in installed if p.module is not None}
    for plugin in installed:
        if plugin.error:
            log.warning("plugin not usable", plugin=plugin.name, error=plugin.error)
    return load_plugins(sorted(good), objects=good, check_cardinality=False, config_path="installed plugins")


def _installed_of_family(family: Family) -> list[str]:
    return [p.name for p in installed_plugins() if p.declaration and family in p.declaration.families]


def installed_allocate_strategies() -> dict[str, contracts.AllocateStrategyFactory]:
    """Strategy name -> factory over every installed plugin."""
    return _installed_loaded().hooks.allocate_strategies()


def installed_filter_compilers() -> dict[str, contracts.FilterCompiler]:
    """Expression type -> compiler over every installed plugin."""
    return _installed_loaded().hooks.filter_compilers()


def installed_of_family(family: Family) -> list[str]:
    """Names of the installed plugins that declare ``family`` (for error messages and the demo)."""
    return _installed_of_family(family)


def plugin_module(name: str) -> ModuleType | object:
    """Load one installed plugin by entry-point name (PluginError if unknown or broken)."""
    known = available_plugins()
    if name not in known:
        raise PluginError(f"unknown plugin {name!r}.{_suggest(name, known)} Installed: {', '.join(sorted(known))}")
    return _load_entry_point(name, known[name])
