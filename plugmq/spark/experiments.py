"""The experiments file: workloads, plugin sets and the matrix, validated into frozen values.

Format (TOML, or YAML when PyYAML is installed)::

    [run]
    seed = 42                      # randomises the execution order (and nothing else)
    window_s = 10                  # time-series window

    [sweep]                        # allocation sweep over every (queues, consumers) pair
    max_queues = 1000
    max_consumers = 1000
    strategies = ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]

    [workloads.levels_mix]         # OpenMessaging Benchmark vocabulary ...
    topics = 1
    queues_per_topic = 4
    message_size = 256
    producers_per_topic = 1
    producer_rate = 20             # msg/s per producer; 0 = as fast as possible (real clock only)
    subscriptions_per_topic = 1
    consumers_per_subscription = 2
    warmup_s = 0
    duration_s = 120
    backlog_messages = 0
    seed = 7
    batch_size = 1                 # ... plus broker extensions
    clock = "virtual"              # "virtual" (ManualClock) or "real"; default virtual with delay/churn
    delay = { fraction = 0.5, levels = [1, 2, 3] }
    # delay = { fraction = 0.5, distribution = "uniform", min_delay_s = 1, max_delay_s = 600 }
    #   (+ burst_ms = 500: deliver-at times rounded up to a multiple of 500 ms, due together)
    # filter = { type = "TAG", selectivity = 0.1 }
    # churn = { joins_per_minute = 2, leaves_per_minute = 2 }
    # serve = { receive_batch = 16 }   # through `plugmq serve` and the official Python client (real clock)

    [plugin_sets.replicated]       # a master and its slave: the runner starts the slave itself
    plugins = ["store_mmap", "ha"]
    options.store_mmap = { flush = "async" }
    options.ha = { heartbeat_ms = 200 }
    broker = { role = "sync_master" }          # or "async_master" (the default)
    # server = { executor_threads = 8 }        # [server] options of `plugmq serve` (served workloads)

    [plugin_sets.wheel]
    plugins = ["store_mmap", "delay_wheel", "filter_tag", "alloc"]
    options.store_mmap = { flush = "async" }   # the store's flush must always be stated
    allocation_strategy = "AVG"

    [[matrix]]
    name = "delay_strategies"      # one report section per matrix
    kind = "delay"                 # a plugmq.spark.kinds name: delay, storage, served, replication, ...
    workloads = ["levels_mix"]
    plugin_sets = ["wheel"]
    repetitions = 3

Every error is a ConfigError naming the key path (``workloads.levels_mix.delay.fraction: ...``).
"""

from __future__ import annotations

import difflib
import math
import random
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.config.broker import load_config
from plugmq.core.contracts import Family
from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.core.pluginmanager import build_options, load_plugins
from plugmq.spark.kinds import KINDS as _KINDS

__all__ = [
    "Churn",
    "DelayMix",
    "Experiment",
    "ExperimentsFile",
    "FilterSpec",
    "Matrix",
    "PluginSet",
    "ServeSpec",
    "SweepSpec",
    "Workload",
    "expand_matrix",
    "load_experiments",
    "parse_experiments",
]

KINDS = tuple(_KINDS)  # what a matrix can compare: plugmq.spark.kinds
CLOCKS = ("virtual", "real")
FLUSH_MODES = ("sync", "async")
SWEEP_STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# ------------------------------------------------------------------------------------------ values
@attrs.frozen
class DelayMix:
    """Which messages are delayed and by how much.

    ``levels``: RocketMQ delay levels, sent as ``delay_level`` (every strategy can express them).
    ``distribution``: "uniform" or "exponential" delays in [min_delay_s, max_delay_s], sent as a
    deliver-at time (a level-only strategy must refuse them: the experiment reports "unsupported").
    ``burst_ms`` (deliver-at times only): each deliver-at time is rounded up to the next multiple of
    ``burst_ms`` of the clock, so every message drawn for one window falls due at the same instant
    (a burst the strategy must fire at once). 0: no rounding.
    """

    fraction: float
    levels: tuple[int, ...] | None = None
    distribution: str | None = None
    min_delay_s: float = 1.0
    max_delay_s: float = 0.0
    mean_delay_s: float = 0.0
    burst_ms: int = 0

    @property
    def arbitrary(self) -> bool:
        return self.distribution is not None


@attrs.frozen
class FilterSpec:
    """The subscription expression and the tag / property distribution it is run against.

    ``tags``: (tag, weight) pairs; ``properties``: (name, ((value, weight), ...)) pairs; a
    ``uniform_int`` property draws an integer in [low, high). With ``selectivity`` alone, both the
    distribution and the expression are generated so that this fraction of messages matches.
    """

    type: str
    expression: str
    tags: tuple[tuple[str, float], ...] = ()
    properties: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    uniform_ints: tuple[tuple[str, int, int], ...] = ()
    selectivity: float | None = None


@attrs.frozen
class Churn:
    joins_per_minute: float = 0.0
    leaves_per_minute: float = 0.0
    min_consumers: int = 1


@attrs.frozen
class ServeSpec:
    """A served workload: the broker runs behind ``plugmq serve`` in a child process and the
    official Python client drives it. Producers (``producers_per_topic`` per topic, one client
    Producer each) send from the experiment's process; the consumers (``consumers_per_subscription``
    SimpleConsumer threads per subscription) receive ``receive_batch`` messages at a time and ack
    each one, from a process of their own, as separate applications would."""

    receive_batch: int = 16
    invisible_s: int = 30
    long_polling_s: int = 1
    request_timeout_s: int = 10  # the client takes whole seconds


@attrs.frozen
class Workload:
    name: str
    topics: int = 1
    queues_per_topic: int = 4
    message_size: int = 128
    producers_per_topic: int = 1
    producer_rate: float = 0.0
    subscriptions_per_topic: int = 1
    consumers_per_subscription: int = 1
    warmup_s: float = 0.0
    duration_s: float = 10.0
    backlog_messages: int = 0
    seed: int = 0
    batch_size: int = 1
    flush: str | None = None
    clock: str = "real"
    step_ms: int = 1000
    drain_s: float = 0.0
    delay: DelayMix | None = None
    filter: FilterSpec | None = None
    churn: Churn | None = None
    serve: ServeSpec | None = None


@attrs.frozen
class PluginSet:
    name: str
    plugins: tuple[str, ...]
    options: Mapping[str, Mapping[str, Any]]
    store: str
    flush: str
    delay: str | None
    allocation_strategy: str = "AVG"
    allocation_params: Mapping[str, Any] = attrs.field(factory=dict)
    broker: Mapping[str, Any] = attrs.field(factory=dict)
    replication: str | None = None  # the replication plugin: the runner starts a slave for the master
    role: str = "async_master"
    server: Mapping[str, Any] = attrs.field(factory=dict)  # [server] options for served workloads


@attrs.frozen
class Matrix:
    name: str
    kind: str
    workloads: tuple[str, ...]
    plugin_sets: tuple[str, ...]
    repetitions: int = 1
    reseed: bool = False


@attrs.frozen
class SweepSpec:
    max_queues: int = 1000
    max_consumers: int = 1000
    strategies: tuple[str, ...] = SWEEP_STRATEGIES
    virtual_nodes: int = 10

    @property
    def enabled(self) -> bool:
        return self.max_queues > 0 and self.max_consumers > 0 and bool(self.strategies)


@attrs.frozen
class ExperimentsFile:
    source: str
    seed: int
    window_s: float
    workloads: Mapping[str, Workload]
    plugin_sets: Mapping[str, PluginSet]
    matrices: tuple[Matrix, ...]
    sweep: SweepSpec | None


@attrs.frozen
class Experiment:
    """One cell of the matrix: a workload on a plugin set, one repetition. ``order`` is its place
    in the randomised run order (and its Spark partition)."""

    experiment_id: str
    order: int
    matrix: str
    kind: str
    workload: Workload
    plugin_set: PluginSet
    repetition: int
    seed: int

    @property
    def effective_flush(self) -> str:
        return self.workload.flush or self.plugin_set.flush

    def store_options(self) -> dict[str, dict[str, Any]]:
        """Plugin options with the workload's flush mode applied to the store, if it sets one."""
        options = {name: dict(table) for name, table in self.plugin_set.options.items()}
        options.setdefault(self.plugin_set.store, {})["flush"] = self.effective_flush
        return options


# ------------------------------------------------------------------------------------------ reading
def load_experiments(path: str | Path) -> ExperimentsFile:
    """Read and validate an experiments file (``.toml``, or ``.yaml``/``.yml`` with PyYAML)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiments file: {exc.strerror or exc}") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write the file as TOML") from exc
        try:
            data = yaml.safe_load(raw.decode("utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    else:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the experiments file must be a table at the top level")
    return parse_experiments(data, source=str(path))


class _Table:
    """A mapping read key by key; ``done()`` reports keys nobody asked for (typos)."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path} must be a table, got {data!r}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        return self.data.get(name, default)

    def integer(self, name: str, default: int, *, low: int | None = None) -> int:
        value = self.raw(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.key(name)} must be an integer, got {value!r}")
        if low is not None and value < low:
            raise ConfigError(f"{self.key(name)} must be >= {low}, got {value}")
        return value

    def number(self, name: str, default: float, *, low: float | None = None, high: float | None = None,
              above: float | None = None) -> float:
        value = self.raw(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{self.key(name)} must be a finite number, got {value!r}")
        if low is not None and value < low:
            raise ConfigError(f"{self.key(name)} must be >= {low}, got {value}")
        if high is not None and value > high:
            raise ConfigError(f"{self.key(name)} must be <= {high}, got {value}")
        if above is not None and value <= above:
            raise ConfigError(f"{self.key(name)} must be > {above}, got {value}")
        return float(value)

    def text(self, name: str, default: str | None, *, choices: Sequence[str] | None = None) -> str | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{self.key(name)} must be a string, got {value!r}")
        if choices is not None and value not in choices:
            raise ConfigError(f"{self.key(name)} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def names(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            raise ConfigError(f"{self.key(name)} is required: a list of names")
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.key(name)} must be a non-empty list of names, got {value!r}")
        return tuple(value)

    def table(self, name: str) -> _Table | None:
        value = self.raw(name)
        return None if value is None else _Table(value, self.key(name))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(self.used), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{self.key(unknown[0])}: unknown key.{hint} Known keys here: {', '.join(sorted(self.used))}")


def _check_name(kind: str, name: str, path: str) -> str:
    if not _NAME.match(name):
        raise ConfigError(f"{path}: {kind} name {name!r} must be 1-64 characters of letters, digits, '_' or '-'")
    return name


def _weights(data: Any, path: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{path} must be a non-empty table of value = weight")
    out = []
    for value, weight in data.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0 or not math.isfinite(weight):
            raise ConfigError(f"{path}.{value} must be a weight >= 0, got {weight!r}")
        out.append((str(value), float(weight)))
    if sum(w for _, w in out) <= 0:
        raise ConfigError(f"{path}: the weights sum to 0; give at least one value a positive weight")
    return tuple(out)


def _parse_delay(t: _Table) -> DelayMix:
    fraction = t.number("fraction", 0.0, low=0.0, high=1.0)
    levels_raw = t.raw("levels")
    distribution = t.text("distribution", None, choices=("uniform", "exponential"))
    if (levels_raw is None) == (distribution is None):
        raise ConfigError(f"{t.path}: give exactly one of 'levels' (a list of RocketMQ delay levels) or "
                          "'distribution' (\"uniform\" or \"exponential\" with max_delay_s)")
    levels = None
    if levels_raw is not None:
        if (not isinstance(levels_raw, list) or not levels_raw
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in levels_raw)):
            raise ConfigError(f"{t.key('levels')} must be a non-empty list of delay levels >= 1, got {levels_raw!r}")
        levels = tuple(levels_raw)
    min_delay = t.number("min_delay_s", 1.0, low=0.0)
    max_delay = t.number("max_delay_s", 0.0, low=0.0)
    mean_delay = t.number("mean_delay_s", 0.0, low=0.0)
    if distribution is not None:
        if max_delay <= min_delay:
            raise ConfigError(f"{t.key('max_delay_s')} must be above min_delay_s ({min_delay}) for a "
                              f"{distribution} distribution, got {max_delay}")
        if distribution == "exponential" and mean_delay <= 0:
            raise ConfigError(f"{t.key('mean_delay_s')} must be > 0 for an exponential distribution")
    burst_ms = t.integer("burst_ms", 0, low=0)
    if burst_ms and distribution is None:
        raise ConfigError(f"{t.key('burst_ms')}: bursts round deliver-at times; a level delay is relative to the "
                          "send and cannot be aligned (use a distribution, or remove burst_ms)")
    t.done()
    return DelayMix(fraction, levels, distribution, min_delay, max_delay, mean_delay, burst_ms)


def _parse_filter(t: _Table) -> FilterSpec:
    ftype = t.text("type", None, choices=("TAG", "SQL92"))
    if ftype is None:
        raise ConfigError(f"{t.key('type')} is required: \"TAG\" or \"SQL92\"")
    expression = t.text("expression", None)
    selectivity = t.raw("selectivity")
    tags_t = t.raw("tags")
    props_t = t.raw("properties")
    if selectivity is not None:
        selectivity = t.number("selectivity", 0.0, low=0.0, high=1.0)
    if selectivity is not None and (expression or tags_t or props_t):
        raise ConfigError(f"{t.path}: give either 'selectivity' alone (distribution and expression are generated) "
                          "or 'expression' with 'tags' / 'properties', not both")
    if selectivity is not None:
        t.done()
        if ftype == "TAG":
            rest = (1.0 - selectivity) / 4
            tags = (("Match", selectivity), *((f"Other{i}", rest) for i in range(4)))
            return FilterSpec("TAG", "Match", tags=tuple((k, w) for k, w in tags if w > 0), selectivity=selectivity)
        bound = round(selectivity * 10_000)
        return FilterSpec("SQL92", f"score < {bound}", uniform_ints=(("score", 0, 10_000),), selectivity=bound / 10_000)
    if not expression:
        raise ConfigError(f"{t.key('expression')} is required unless 'selectivity' is given")
    tags = _weights(tags_t, t.key("tags")) if tags_t is not None else ()
    properties: list[tuple[str, tuple[tuple[str, float], ...]]] = []
    uniform: list[tuple[str, int, int]] = []
    if props_t is not None:
        if not isinstance(props_t, Mapping):
            raise ConfigError(f"{t.key('properties')} must be a table: name = {{ value = weight, ... }}")
        for name, spec in props_t.items():
            path = f"{t.key('properties')}.{name}"
            if isinstance(spec, Mapping) and set(spec) == {"uniform_int"}:
                bounds = spec["uniform_int"]
                if (not isinstance(bounds, list) or len(bounds) != 2 or not all(isinstance(b, int) for b in bounds)
                        or bounds[0] >= bounds[1]):
                    raise ConfigError(f"{path}.uniform_int must be [low, high) integers with low < high, got {bounds!r}")
                uniform.append((str(name), bounds[0], bounds[1]))
            else:
                properties.append((str(name), _weights(spec, path)))
    if ftype == "TAG" and not tags:
        raise ConfigError(f"{t.key('tags')} is required for a TAG filter with an explicit expression")
    t.done()
    return FilterSpec(ftype, expression, tags, tuple(properties), tuple(uniform), None)


def _parse_churn(t: _Table) -> Churn:
    churn = Churn(t.number("joins_per_minute", 0.0, low=0.0), t.number("leaves_per_minute", 0.0, low=0.0),
                  t.integer("min_consumers", 1, low=1))
    t.done()
    return churn


def _parse_serve(t: _Table) -> ServeSpec:
    spec = ServeSpec(t.integer("receive_batch", 16, low=1), t.integer("invisible_s", 30, low=1),
                     t.integer("long_polling_s", 1, low=1), t.integer("request_timeout_s", 10, low=1))
    t.done()
    return spec


def _check_served(w: Workload, t: _Table) -> None:
    """What a served workload cannot do (yet): say so instead of measuring something else."""
    what = t.key("serve")
    if w.clock != "real":
        raise ConfigError(f"{what}: a served workload runs on the real clock (plugmq serve in a child process); "
                          "remove clock = \"virtual\"")
    if w.batch_size != 1:
        raise ConfigError(f"{t.key('batch_size')}: the official Python client sends one message per SendMessage; "
                          "use batch_size = 1 with serve")
    for key, value in (("delay", w.delay is not None and w.delay.fraction > 0), ("filter", w.filter is not None),
                       ("churn", w.churn is not None)):
        if value:
            raise ConfigError(f"{t.key(key)}: not measured through plugmq serve; compare {key} on an embedded "
                              "broker (a workload without serve)")


def _parse_workload(name: str, t: _Table) -> Workload:
    delay_t, filter_t, churn_t, serve_t = t.table("delay"), t.table("filter"), t.table("churn"), t.table("serve")
    delay = _parse_delay(delay_t) if delay_t else None
    flt = _parse_filter(filter_t) if filter_t else None
    churn = _parse_churn(churn_t) if churn_t else None
    serve = _parse_serve(serve_t) if serve_t is not None else None
    default_clock = "virtual" if (delay is not None or churn is not None) else "real"
    w = Workload(
        name=name,
        topics=t.integer("topics", 1, low=1),
        queues_per_topic=t.integer("queues_per_topic", 4, low=1),
        message_size=t.integer("message_size", 128, low=16),
        producers_per_topic=t.integer("producers_per_topic", 1, low=1),
        producer_rate=t.number("producer_rate", 0.0, low=0.0),
        subscriptions_per_topic=t.integer("subscriptions_per_topic", 1, low=0),
        consumers_per_subscription=t.integer("consumers_per_subscription", 1, low=1),
        warmup_s=t.number("warmup_s", 0.0, low=0.0),
        duration_s=t.number("duration_s", 10.0, above=0.0),
        backlog_messages=t.integer("backlog_messages", 0, low=0),
        seed=t.integer("seed", 0),
        batch_size=t.integer("batch_size", 1, low=1),
        flush=t.text("flush", None, choices=FLUSH_MODES),
        clock=t.text("clock", default_clock, choices=CLOCKS) or default_clock,
        step_ms=t.integer("step_ms", 1000, low=1),
        drain_s=t.number("drain_s", 0.0, low=0.0),
        delay=delay,
        filter=flt,
        churn=churn,
        serve=serve,
    )
    t.done()
    if w.serve is not None:
        _check_served(w, t)
    if w.clock == "virtual" and w.producer_rate <= 0:
        raise ConfigError(f"{t.key('producer_rate')}: a virtual-clock workload needs a rate > 0 "
                          "(\"as fast as possible\" has no meaning in virtual time); set clock = \"real\" or a rate")
    if w.delay is not None and w.delay.fraction > 0 and w.batch_size > 1:
        raise ConfigError(f"{t.key('batch_size')}: delayed messages cannot be batched (RocketMQ rule); "
                          "use batch_size = 1 with a delay mix")
    if w.delay is not None and w.delay.burst_ms and w.producer_rate <= 0:
        raise ConfigError(f"{t.key('producer_rate')}: a burst workload (delay.burst_ms) needs a fixed rate, so every "
                          "strategy fires bursts of the same size (as fast as possible, a slower send makes "
                          "smaller bursts)")
    if w.churn is not None and w.clock != "virtual":
        raise ConfigError(f"{t.key('churn')}: consumer churn is replayed on the virtual clock; set clock = \"virtual\"")
    if w.churn is not None and w.subscriptions_per_topic < 1:
        raise ConfigError(f"{t.key('churn')}: churn needs at least one subscription (subscriptions_per_topic >= 1)")
    if w.clock == "real" and w.delay is not None and w.delay.fraction > 0 and w.drain_s <= 0:
        longest = (max(w.delay.levels) if w.delay.levels else w.delay.max_delay_s)
        raise ConfigError(f"{t.key('drain_s')}: a real-clock workload with delayed messages must say how long to "
                          f"wait for them after producing stops (drain_s); the longest delay is {longest}"
                          f"{' (level)' if w.delay.levels else ' s'}")
    return w


def _store_of(loaded: Any, path: str) -> str:
    stores = loaded.with_family(Family.STORAGE)
    if len(stores) != 1:
        raise ConfigError(f"{path}: a plugin set needs exactly one storage plugin, got {stores or 'none'}")
    return stores[0]


def _parse_plugin_set(name: str, t: _Table) -> PluginSet:
    plugins = t.names("plugins")
    options_raw = t.raw("options") or {}
    if not isinstance(options_raw, Mapping):
        raise ConfigError(f"{t.key('options')} must be a table of plugin name = {{ option = value }}")
    try:
        loaded = load_plugins(plugins, config_path=t.key("plugins"))
    except PlugmqError as exc:
        raise ConfigError(str(exc) if t.key("plugins") in str(exc) else f"{t.key('plugins')}: {exc}") from exc
    store = _store_of(loaded, t.key("plugins"))
    for plugin in options_raw:
        if plugin not in plugins:
            raise ConfigError(f"{t.key('options')}.{plugin}: options for a plugin that is not in this set's plugins "
                              f"({', '.join(plugins)})")
    store_table = options_raw.get(store) or {}
    flush = store_table.get("flush") if isinstance(store_table, Mapping) else None
    if flush is None:
        raise ConfigError(f"{t.key('options')}.{store}.flush: the durability mode must be stated explicitly for "
                          f"every plugin set: add options.{store} = {{ flush = \"sync\" }} (or \"async\")")
    if flush not in FLUSH_MODES:
        raise ConfigError(f"{t.key('options')}.{store}.flush must be \"sync\" or \"async\", got {flush!r}")
    for plugin, decl in loaded.declarations.items():
        build_options(decl, options_raw.get(plugin), config_path=f"{t.key('options')}.{plugin}")
    broker = t.raw("broker") or {}
    if not isinstance(broker, Mapping):
        raise ConfigError(f"{t.key('broker')} must be a table of broker settings")
    for fixed in ("name", "data_dir", "plugins", "broker_id"):
        if fixed in broker:
            raise ConfigError(f"{t.key('broker')}.{fixed}: set by the experiment runner, not by a plugin set")
    replications = loaded.with_family(Family.REPLICATION)
    replication = replications[0] if replications else None
    role = broker.get("role", "async_master")
    if role == "slave":
        raise ConfigError(f"{t.key('broker')}.role: a plugin set describes the master; with a replication plugin "
                          "in the set the runner starts its slave itself (same plugins and options, role = \"slave\")")
    if role == "sync_master" and replication is None:
        raise ConfigError(f"{t.key('broker')}.role = \"sync_master\" waits for a slave: add a replication plugin "
                          "(e.g. \"ha\") to plugins, or use role = \"async_master\"")
    try:
        load_config({"broker": {**broker, "plugins": list(plugins)}, "plugins": dict(options_raw)})
    except ConfigError as exc:
        raise ConfigError(f"{t.key('broker')}: {exc}") from exc
    strategy = t.text("allocation_strategy", "AVG") or "AVG"
    strategies = loaded.hooks.allocate_strategies()
    if strategy not in strategies:
        raise ConfigError(f"{t.key('allocation_strategy')}: {strategy!r} is not offered by the set's plugins; "
                          f"available: {', '.join(sorted(strategies)) or 'none (add the alloc plugin)'}")
    params = t.raw("allocation_params") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{t.key('allocation_params')} must be a table of strategy parameters")
    try:
        strategies[strategy](**params)
    except (PlugmqError, TypeError, ValueError) as exc:
        raise ConfigError(f"{t.key('allocation_params')}: {exc}") from exc
    server = _parse_server(t)
    t.done()
    delays = loaded.with_family(Family.DELAY)
    return PluginSet(
        name=name, plugins=plugins, options={k: dict(v) for k, v in options_raw.items()}, store=store,
        flush=flush, delay=delays[0] if delays else None, allocation_strategy=strategy,
        allocation_params=dict(params), broker=dict(broker), replication=replication, role=str(role),
        server=server,
    )


def _parse_server(t: _Table) -> dict[str, Any]:
    """``server = {...}``: the ``[server]`` options ``plugmq serve`` gets for served workloads."""
    server = t.raw("server") or {}
    if not isinstance(server, Mapping):
        raise ConfigError(f"{t.key('server')} must be a table of plugmq serve's [server] options")
    if "listen" in server:
        raise ConfigError(f"{t.key('server')}.listen: set by the experiment runner (a free loopback port)")
    if server:
        try:
            from plugmq.server.options import parse_server_table
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{t.key('server')}: checking [server] options needs the 'serve' extra "
                              f"({exc.name} is missing): pip install 'plugmq[serve]'") from exc
        parse_server_table(server, source=t.path)
    return dict(server)


def _parse_sweep(t: _Table) -> SweepSpec:
    strategies = t.names("strategies") if t.has("strategies") else SWEEP_STRATEGIES
    for s in strategies:
        if s not in SWEEP_STRATEGIES:
            raise ConfigError(f"{t.key('strategies')}: the sweep models {', '.join(SWEEP_STRATEGIES)}, not {s!r}")
    spec = SweepSpec(t.integer("max_queues", 1000, low=0), t.integer("max_consumers", 1000, low=0), strategies,
                     t.integer("virtual_nodes", 10, low=1))
    t.done()
    return spec


def parse_experiments(data: Mapping[str, Any], *, source: str = "<mapping>") -> ExperimentsFile:
    """Validate an experiments mapping (as read from TOML/YAML)."""
    top = _Table(data, "")
    run = top.table("run") or _Table({}, "run")
    seed = run.integer("seed", 0)
    window_s = run.number("window_s", 10.0, above=0.0)
    run.done()
    workloads_t = top.table("workloads")
    sets_t = top.table("plugin_sets")
    if workloads_t is None or not workloads_t.data:
        raise ConfigError("workloads: at least one workload table is required ([workloads.<name>])")
    if sets_t is None or not sets_t.data:
        raise ConfigError("plugin_sets: at least one plugin set is required ([plugin_sets.<name>])")
    workloads = {}
    for name in workloads_t.data:
        _check_name("workload", name, workloads_t.key(name))
        table = workloads_t.table(name)
        assert table is not None
        workloads[name] = _parse_workload(name, table)
    plugin_sets = {}
    for name in sets_t.data:
        _check_name("plugin set", name, sets_t.key(name))
        table = sets_t.table(name)
        assert table is not None
        plugin_sets[name] = _parse_plugin_set(name, table)
    matrices_raw = top.raw("matrix")
    if isinstance(matrices_raw, Mapping):
        matrices_raw = [matrices_raw]
    if not isinstance(matrices_raw, list) or not matrices_raw:
        raise ConfigError("matrix: at least one [[matrix]] table is required (workloads x plugin_sets)")
    matrices = []
    seen = set()
    for i, raw in enumerate(matrices_raw):
        t = _Table(raw, f"matrix[{i}]")
        name = t.text("name", None) or f"matrix{i}"
        _check_name("matrix", name, t.key("name"))
        if name in seen:
            raise ConfigError(f"{t.key('name')}: matrix {name!r} is defined twice; names must be unique")
        seen.add(name)
        kind = t.text("kind", "general", choices=KINDS) or "general"
        wls = t.names("workloads")
        sets = t.names("plugin_sets")
        for w in wls:
            if w not in workloads:
                raise ConfigError(f"{t.key('workloads')}: unknown workload {w!r}; defined: {', '.join(workloads)}")
        for s in sets:
            if s not in plugin_sets:
                raise ConfigError(f"{t.key('plugin_sets')}: unknown plugin set {s!r}; defined: {', '.join(plugin_sets)}")
        if kind == "delay_precision":
            for w in wls:
                wl = workloads[w]
                if wl.clock != "real" or wl.delay is None or wl.delay.fraction <= 0:
                    raise ConfigError(f"{t.key('workloads')}: kind \"delay_precision\" measures delays on the real "
                                      f"clock; workload {w!r} needs clock = \"real\" and a delay mix (compare "
                                      "virtual-clock delays with kind = \"delay\")")
        for s in sets:
            virtual = [w for w in wls if workloads[w].clock == "virtual"]
            if plugin_sets[s].replication is not None and virtual:
                raise ConfigError(f"{t.key('workloads')}: plugin set {s!r} replicates to a slave in another process, "
                                  f"which runs on the real clock; workload {virtual[0]!r} is virtual-clock "
                                  "(give it clock = \"real\" and a drain_s, or compare it without replication)")
        matrices.append(Matrix(name, kind, wls, sets, t.integer("repetitions", 1, low=1),
                               bool(t.raw("reseed", False))))
        t.done()
    sweep_t = top.table("sweep")
    sweep = _parse_sweep(sweep_t) if sweep_t is not None else None
    top.done()
    return ExperimentsFile(source, seed, window_s, workloads, plugin_sets, tuple(matrices), sweep)


def expand_matrix(spec: ExperimentsFile, *, seed: int | None = None) -> list[Experiment]:
    """Every (matrix, workload, plugin set, repetition), in an order shuffled with the seed.

    The same seed gives the same order; ``order`` numbers the experiments 0..n-1 in run order.
    """
    cells = []
    for m in spec.matrices:
        for w in m.workloads:
            for s in m.plugin_sets:
                for r in range(m.repetitions):
                    cells.append((m, spec.workloads[w], spec.plugin_sets[s], r))
    rng = random.Random(spec.seed if seed is None else seed)
    rng.shuffle(cells)
    return [
        Experiment(
            experiment_id=f"{m.name}/{w.name}/{s.name}/r{r}", order=i, matrix=m.name, kind=m.kind,
            workload=w, plugin_set=s, repetition=r, seed=w.seed + (r if m.reseed else 0),
        )
        for i, (m, w, s, r) in enumerate(cells)
    ]
