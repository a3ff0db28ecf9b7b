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
    # chaos = { faults = ["kill-master"], rounds = 2 }   # a plugmq chaos schedule per plugin set (kind = "chaos")

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

Every table is an attrs schema checked by the configuration engine (:mod:`plugmq.core.schema`; the
workloads' in :mod:`plugmq.spark.workload_tables`), each on its own, then the plugin sets against their
plugins (:mod:`plugmq.spark.plugin_sets`) and the matrices against both: a bad file is one
ConfigError listing every problem, each naming its key path (``workloads.levels_mix.delay.fraction
must be <= 1.0, got 1.5``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import attrs

from plugmq.config.broker import read_toml
from plugmq.core.errors import ConfigError
from plugmq.core.schema import (
    Expect,
    Mismatch,
    Problems,
    Refusal,
    above,
    at_least,
    one_of,
    setting,
)
from plugmq.spark.kinds import KINDS as _KINDS
from plugmq.spark.workload_tables import (
    ChaosSpec,
    Churn,
    DelayMix,
    FilterSpec,
    FilterTable,
    Finite,
    ServeSpec,
    Workload,
)

__all__ = [
    "EXPERIMENT_TABLES",
    "ChaosSpec",
    "Churn",
    "DelayMix",
    "Experiment",
    "ExperimentsFile",
    "ExperimentsTables",
    "FilterSpec",
    "FilterTable",
    "Matrix",
    "PluginSet",
    "PluginSetTable",
    "RunTable",
    "ServeSpec",
    "SweepSpec",
    "Workload",
    "expand_matrix",
    "load_experiments",
    "parse_experiments",
]

KINDS = tuple(_KINDS)  # what a matrix can compare: plugmq.spark.kinds
SWEEP_STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
T = TypeVar("T")

# The value types of an experiments file, as the engine (plugmq.core.schema) checks them.
Name = Annotated[str, Expect("a name of 1-64 letters, digits, '_' or '-'", lambda n: bool(_NAME.match(n)))]


def _names(value: Any) -> tuple[str, ...]:
    """One name or a non-empty list of names, as a tuple."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise Mismatch("a non-empty list of names", value)
    return tuple(value)


def names_field(doc: str, default: Any = attrs.NOTHING) -> Any:
    """A key holding one name or a list of names (a tuple once read)."""
    return attrs.field(default=default, converter=_names, metadata={"doc": doc, "expected": "a non-empty list of names"})


@attrs.frozen
class PluginSetTable:
    """``[plugin_sets.<name>]``: the plugins of a broker and their options (the store's flush stated)."""

    plugins: tuple[str, ...] = names_field("the plugins the broker is assembled from")
    options: Mapping[str, Mapping[str, Any]] = setting(
        factory=dict, doc="plugin name = { option = value }: each plugin's [plugins.<name>] table",
        expected="a table of plugin name = { option = value }")
    broker: Mapping[str, Any] = setting(factory=dict, doc="[broker] settings (name, data_dir, plugins and "
                                                          "broker_id are the runner's)",
                                        expected="a table of broker settings")
    allocation_strategy: str = setting("AVG", doc="the consumers' allocation strategy (offered by the set's plugins)")
    allocation_params: Mapping[str, Any] = setting(factory=dict, doc="the strategy's parameters",
                                                   expected="a table of strategy parameters")
    server: Mapping[str, Any] = setting(factory=dict, doc="[server] options of plugmq serve (served workloads)",
                                        expected="a table of plugmq serve's [server] options")


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


@attrs.frozen(kw_only=True)
class Matrix:
    """``[[matrix]]``: workloads x plugin sets, one report section."""

    name: str = setting("", doc="the report section's name (default matrix<i>)",
                        validator=lambda _i, _a, name: _check_name(name))
    kind: str = setting("general", doc="what it compares: a plugmq.spark.kinds name", validator=one_of(*KINDS))
    workloads: tuple[str, ...] = names_field("the workloads it runs")
    plugin_sets: tuple[str, ...] = names_field("the plugin sets it runs them on")
    repetitions: int = setting(1, doc="runs of each cell", validator=at_least(1))
    reseed: bool = setting(False, doc="each repetition adds its number to the workload's seed")


def _check_name(name: str) -> None:
    if name and not _NAME.match(name):
        raise Refusal(f"= {name!r} must be 1-64 characters of letters, digits, '_' or '-'")


def _sweep_strategies(_inst: object, _attr: object, strategies: tuple[str, ...]) -> None:
    for strategy in strategies:
        if strategy not in SWEEP_STRATEGIES:
            raise Refusal(f"the sweep models {', '.join(SWEEP_STRATEGIES)}, not {strategy!r}", colon=True)


@attrs.frozen(kw_only=True)
class SweepSpec:
    """``[sweep]``: the allocation sweep over every (queues, consumers) pair."""

    max_queues: int = setting(1000, doc="queues up to", validator=at_least(0))
    max_consumers: int = setting(1000, doc="consumers up to", validator=at_least(0))
    strategies: tuple[str, ...] = attrs.field(
        default=SWEEP_STRATEGIES, converter=_names, validator=_sweep_strategies,
        metadata={"doc": f"strategies modelled ({', '.join(SWEEP_STRATEGIES)})", "expected": "a list of names"})
    virtual_nodes: int = setting(10, doc="CONSISTENT_HASH virtual nodes", validator=at_least(1))

    @property
    def enabled(self) -> bool:
        return self.max_queues > 0 and self.max_consumers > 0 and bool(self.strategies)


@attrs.frozen
class RunTable:
    """``[run]``: the run as a whole."""

    seed: int = setting(0, doc="randomises the execution order (and nothing else)")
    window_s: Finite = setting(10.0, doc="time-series window", validator=above(0.0))


def _at_least_one(what: str) -> Any:
    def check(_inst: object, _attr: object, value: Any) -> None:
        if not value:
            raise Refusal(f"at least one {what} is required", colon=True)
    return check


@attrs.frozen(kw_only=True)
class ExperimentsTables:
    """The tables of an experiments file (each one checked against its schema on its own)."""

    run: Mapping[str, Any] = setting(factory=dict, doc="the run as a whole", expected="a table", schema=RunTable)
    sweep: Mapping[str, Any] | None = setting(None, doc="the allocation sweep (none: no sweep)", expected="a table",
                                              schema=SweepSpec)
    workloads: Mapping[Name, Mapping[str, Any]] = setting(
        doc="[workloads.<name>] tables", expected="a table of workload tables", schema=Workload,
        validator=_at_least_one("workload table ([workloads.<name>])"))
    plugin_sets: Mapping[Name, Mapping[str, Any]] = setting(
        doc="[plugin_sets.<name>] tables", expected="a table of plugin set tables", schema=PluginSetTable,
        validator=_at_least_one("plugin set ([plugin_sets.<name>])"))
    matrix: tuple[Mapping[str, Any], ...] = setting(
        doc="[[matrix]] tables", expected="a list of [[matrix]] tables", schema=Matrix,
        validator=_at_least_one("[[matrix]] table (workloads x plugin_sets)"))


#: The tables of an experiments file, as the configuration reference lists them.
EXPERIMENT_TABLES: tuple[tuple[str, type], ...] = (("", ExperimentsTables),)


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
    if path.suffix.lower() not in (".yaml", ".yml"):
        return parse_experiments(read_toml(path), source=str(path))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiments file: {exc.strerror or exc}") from exc
    try:
        import yaml
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write the file as TOML") from exc
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the experiments file must be a table at the top level")
    return parse_experiments(data, source=str(path))


def parse_experiments(data: Mapping[str, Any], *, source: str = "<mapping>") -> ExperimentsFile:
    """Validate an experiments mapping (as read from TOML/YAML); a ConfigError lists every problem."""
    from plugmq.spark.plugin_sets import check_plugin_set

    found = Problems()
    matrix = data.get("matrix")
    tables = found.structure({**data, "matrix": [matrix]} if isinstance(matrix, Mapping) else data, ExperimentsTables)
    if tables is None:
        found.raise_any()
    assert tables is not None
    run = found.structure(tables.run, RunTable, ("run",))
    sweep = found.structure(tables.sweep, SweepSpec, ("sweep",)) if tables.sweep is not None else None
    workloads = {name: attrs.evolve(w, name=name) for name, w in _each(found, tables.workloads, Workload,
                                                                     "workloads").items()}
    set_tables = _each(found, tables.plugin_sets, PluginSetTable, "plugin_sets")
    plugin_sets = {name: check_plugin_set(name, table, found) for name, table in set_tables.items()}
    matrices = []
    for i, table in enumerate(tables.matrix):
        m = found.structure(table, Matrix, ("matrix", i))
        if m is not None:
            matrices.append(attrs.evolve(m, name=m.name or f"matrix{i}"))
            _check_matrix(i, matrices, tables, workloads, plugin_sets, found)
    found.raise_any()
    assert run is not None
    return ExperimentsFile(source, run.seed, run.window_s, workloads, {name: s for name, s in plugin_sets.items() if s is not None}, tuple(matrices), sweep)


def _each(found: Problems, tables: Mapping[str, Mapping[str, Any]], schema: type[T], key: str) -> dict[str, T]:
    """The tables that fit ``schema`` (the problems of the others recorded)."""
    out = {}
    for name, table in tables.items():
        value = found.structure(table, schema, (key, name))
        if value is not None:
            out[name] = value
    return out


def _check_matrix(i: int, matrices: list[Matrix], tables: ExperimentsTables, workloads: Mapping[str, Workload],
                  plugin_sets: Mapping[str, PluginSet | None], found: Problems) -> None:
    """What the last matrix read asks of the workloads and plugin sets it names."""
    m, path = matrices[-1], ("matrix", i)
    if any(other.name == m.name for other in matrices[:-1]):
        found.add_at((*path, "name"), f"matrix {m.name!r} is defined twice; names must be unique", colon=True)
    for key, names, defined in (("workloads", m.workloads, tables.workloads),
                                ("plugin_sets", m.plugin_sets, tables.plugin_sets)):
        what = "workload" if key == "workloads" else "plugin set"
        for unknown in [n for n in names if n not in defined]:
            found.add_at((*path, key), f"unknown {what} {unknown!r}; defined: {', '.join(defined)}", colon=True)
    _check_clocks(m, path, [workloads[w] for w in m.workloads if w in workloads], plugin_sets, found)


def _check_clocks(m: Matrix, path: tuple[str | int, ...], named: list[Workload],
                  plugin_sets: Mapping[str, PluginSet | None], found: Problems) -> None:
    """Real-clock kinds and plugin sets (a slave in another process) need real-clock workloads; a
    chaos matrix runs chaos workloads and only it does."""
    for w in named if m.kind == "delay_precision" else ():
        if w.clock != "real" or w.delay is None or w.delay.fraction <= 0:
            found.add_at((*path, "workloads"), f"kind \"delay_precision\" measures delays on the real clock; "
                         f"workload {w.name!r} needs clock = \"real\" and a delay mix (compare virtual-clock "
                         "delays with kind = \"delay\")", colon=True)
    for w in named:
        if (w.chaos is None) == (m.kind == "chaos"):
            found.add_at((*path, "workloads"), f"workload {w.name!r} " + (
                "has no chaos table; kind = \"chaos\" runs a plugmq chaos schedule per plugin set" if m.kind == "chaos"
                else f"is a chaos schedule; compare it in a matrix of kind = \"chaos\" (this one is {m.kind!r})"),
                colon=True)
    virtual = [w.name for w in named if w.clock == "virtual"]
    for s in [s for s in m.plugin_sets if virtual and getattr(plugin_sets.get(s), "replication", None)]:
        found.add_at((*path, "workloads"), f"plugin set {s!r} replicates to a slave in another process, which "
                     f"runs on the real clock; workload {virtual[0]!r} is virtual-clock (give it clock = \"real\" "
                     "and a drain_s, or compare it without replication)", colon=True)


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
