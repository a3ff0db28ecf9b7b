"""The cluster a chaos run starts: ZooKeeper, N brokers of one name, a forwarder on every link.

From the user's broker config (the plugin composition under test) each broker gets its own
config: the same plugins and plugin options, ``ha`` and ``cluster_zk`` added if absent,
``failover = true``, the mode under test as its role, a broker id, its own data directory, and
its links routed through forwarders:

* clients -> the broker's gRPC port: ``[server] advertise`` is the forwarder, so the routes the
  official clients get point there;
* the broker -> ZooKeeper: ``[plugins.cluster_zk] hosts`` is a forwarder of its own (one broker
  alone can be cut off ZooKeeper);
* a slave -> the master's ha port: only when the ha plugin can register a replication address
  other than the one it binds (``[plugins.ha] advertise``); without it the brokers replicate
  directly and the faults on that link are refused with that reason.

The harness itself (status probes, the read-back's master lookup) reaches brokers directly.
"""

from __future__ import annotations

import copy
import signal
import tomllib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.chaos.forwarder import Forwarder
from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.testing.cluster import ServeProcess, status_or_none
from plugmq.testing.zookeeper import ZooKeeperServer, free_port

__all__ = ["MODES", "BrokerNode", "ChaosCluster", "compose_broker_config", "load_user_config"]

MODES = ("sync_master", "async_master")
#: Replication timings that let a fault play out in seconds (the user's own values win).
_HA_DEFAULTS = {"heartbeat_ms": 100, "peer_timeout_ms": 3000, "reconnect_ms": 20, "reconnect_max_ms": 200,
                "sync_timeout_ms": 3000}


def load_user_config(source: Path | Mapping[str, Any]) -> dict[str, Any]:
    """The user's broker config (a TOML file or a mapping), checked for what chaos needs."""
    if isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
        where = "<config>"
    else:
        where = str(source)
        try:
            raw = tomllib.loads(Path(source).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"chaos config {source} does not exist; pass a broker TOML (see examples/chaos)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    plugins = raw.get("broker", {}).get("plugins")
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins) or not plugins:
        raise ConfigError(f"{where}: [broker] plugins must list the plugins under test, e.g. "
                          'plugins = ["store_mmap", "delay_wheel", "filter_tag"]')
    return raw


def compose_broker_config(user: Mapping[str, Any], *, broker_id: int, mode: str, zookeeper: str, cluster: str,
                          session_timeout_s: float, advertise: str, ha_listen: str | None = None,
                          ha_advertise: str | None = None) -> dict[str, Any]:
    """One broker's config from the user's: their plugins and options, chaos's cluster wiring."""
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    config = copy.deepcopy(dict(user))
    broker = config.setdefault("broker", {})
    plugins = list(broker["plugins"])
    plugins += [p for p in ("ha", "cluster_zk") if p not in plugins]
    broker.update(plugins=plugins, broker_id=broker_id, role=mode, failover=True, data_dir="data")
    broker.setdefault("name", "broker-chaos")
    config["cluster"] = {**config.get("cluster", {}), "name": cluster}
    options = config.setdefault("plugins", {})
    options["cluster_zk"] = {**options.get("cluster_zk", {}), "hosts": zookeeper,
                             "session_timeout_s": session_timeout_s}
    ha = {**_HA_DEFAULTS, **options.get("ha", {})}
    ha.pop("master", None)  # with failover the election says whom a slave follows
    if ha_listen is not None:
        ha["listen"] = ha_listen
    if ha_advertise is not None:
        ha["advertise"] = ha_advertise
    options["ha"] = ha
    server = config.setdefault("server", {})
    server.pop("listen", None)
    server["advertise"] = advertise
    server.setdefault("long_polling_s", 1)
    return config


def ha_link_supported(user: Mapping[str, Any]) -> str | None:
    """None when the ha plugin can advertise a replication address of chaos's choosing (so the
    slave -> master link can go through a forwarder); else why not."""
    from plugmq.core.pluginmanager import build_options, load_plugins

    plugins = list(user.get("broker", {}).get("plugins", []))
    plugins += [p for p in ("ha", "cluster_zk") if p not in plugins]
    try:
        loaded = load_plugins(plugins, config_path="chaos: broker.plugins")
        build_options(loaded.declarations["ha"], {**user.get("plugins", {}).get("ha", {}),
                                                  "advertise": "127.0.0.1:1"}, config_path="chaos: plugins.ha")
    except PlugmqError as exc:
        return ("the ha plugin cannot register a replication address other than the one it binds "
                f"([plugins.ha] advertise): {exc}")
    return None


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@attrs.define
class BrokerNode:
    """One broker of the cluster: its config, its child process (None while down), its forwarders."""

    name: str
    config: Path
    grpc: Forwarder
    zookeeper: Forwarder
    ha: Forwarder | None
    process: ServeProcess | None = None
    address: str | None = None  # its own gRPC address (the harness's; clients use ``grpc``)
    suspended: bool = False

    def forwarders(self) -> list[Forwarder]:
        return [f for f in (self.grpc, self.zookeeper, self.ha) if f is not None]


class ChaosCluster:
    """ZooKeeper and ``brokers`` brokers of one name in ``directory``, every link forwarded."""

    def __init__(self, directory: Path, user: Mapping[str, Any], *, brokers: int = 2, mode: str = "sync_master",
                 session_timeout_s: float = 2.0, forward_ha: bool = False, seed: int | None = None) -> None:
        if brokers < 2:
            raise ConfigError(f"a failover cluster needs at least 2 brokers, got {brokers}")
        self.directory = directory
        self.mode = mode
        self.session_timeout_s = session_timeout_s
        self.zookeeper = ZooKeeperServer(directory / "zookeeper")
        self.nodes: list[BrokerNode] = []
        self._user = user
        self._brokers = brokers
        self._forward_ha = forward_ha
        self._seed = seed
        self.cluster_name = f"chaos-{uuid.uuid4().hex[:8]}"

    @property
    def broker_name(self) -> str:
        return str(self._user.get("broker", {}).get("name", "broker-chaos"))

    @property
    def endpoints(self) -> str:
        """What the official clients are given: every broker's gRPC forwarder."""
        return ";".join(node.grpc.address for node in self.nodes)

    def start(self, wait_s: float = 90.0) -> None:
        import tomli_w

        hosts = self.zookeeper.start()
        zk_target = _address(hosts)
        for broker_id in range(1, self._brokers + 1):
            name = f"n{broker_id}"
            seed = None if self._seed is None else self._seed * 100 + broker_id
            where = self.directory / name
            where.mkdir(parents=True, exist_ok=True)
            ha_port = free_port() if self._forward_ha else None
            # The node owns its forwarders from their creation: stop() ends them whatever fails next.
            node = BrokerNode(name, where / "broker.toml", Forwarder(f"{name}-grpc", seed=seed),
                              Forwarder(f"{name}-zk", zk_target, seed=seed),
                              None if ha_port is None else Forwarder(f"{name}-ha", ("127.0.0.1", ha_port), seed=seed))
            self.nodes.append(node)
            config = compose_broker_config(
                self._user, broker_id=broker_id, mode=self.mode, zookeeper=node.zookeeper.address,
                cluster=self.cluster_name, session_timeout_s=self.session_timeout_s, advertise=node.grpc.address,
                ha_listen=None if ha_port is None else f"127.0.0.1:{ha_port}",
                ha_advertise=None if node.ha is None else node.ha.address)
            node.config.write_text(tomli_w.dumps(config), encoding="utf-8")
        for node in self.nodes:
            self.start_broker(node, wait_s=wait_s, await_address=False)
        for node in self.nodes:
            self._await(node)

    def start_broker(self, node: BrokerNode, *, wait_s: float = 90.0, await_address: bool = True) -> None:
        """Start (or restart) ``node``'s ``plugmq serve`` child; its forwarder then points at it."""
        node.process = ServeProcess(node.config, wait_s=wait_s)
        node.suspended = False
        if await_address:
            self._await(node)

    def _await(self, node: BrokerNode) -> None:
        assert node.process is not None
        try:
            node.address = node.process.await_address()
        except AssertionError:
            raise PlugmqError(f"broker {node.name} did not start: {_last_error(node.process.log_path)} "
                              f"(log: {node.process.log_path})") from None
        node.grpc.retarget(_address(node.address))

    def kill(self, node: BrokerNode) -> None:
        """kill -9 of ``node``'s broker; its forwarder refuses connections until it is back."""
        if node.process is not None:
            node.process.stop(signal.SIGKILL)
        node.process = None
        node.address = None
        node.grpc.retarget(None)

    def suspend(self, node: BrokerNode) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)
        node.suspended = True

    def resume(self, node: BrokerNode) -> None:
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)
        node.suspended = False

    def statuses(self, timeout_s: float = 1.0) -> dict[str, dict[str, Any] | None]:
        """Each broker's broker-status (None: down, frozen or not answering)."""
        return {node.name: (status_or_none(node.address, timeout_s)
                            if node.address is not None and not node.suspended else None) for node in self.nodes}

    def master(self, statuses: Mapping[str, dict[str, Any] | None] | None = None) -> BrokerNode | None:
        """The broker that says it is the master (the newest epoch if two do), or None."""
        statuses = self.statuses() if statuses is None else statuses
        masters = [(int(s.get("epoch") or 0), node) for node in self.nodes
                   if (s := statuses.get(node.name)) is not None and s.get("role") == self.mode]
        return max(masters, key=lambda pair: pair[0])[1] if masters else None

    def settled(self) -> bool:
        """One master; every other broker up, a slave, connected, and at the master's log end."""
        statuses = self.statuses()
        master = self.master(statuses)
        if master is None:
            return False
        end = (statuses[master.name] or {}).get("replication", {}).get("end_offset")
        for node in self.nodes:
            status = statuses[node.name]
            if node is master:
                continue
            if status is None or status.get("role") != "slave":
                return False
            replication = status.get("replication", {})
            if not replication.get("connected") or replication.get("end_offset") != end:
                return False
        return True

    def stop(self) -> None:
        """Stop every broker (continued first if frozen), ZooKeeper and every forwarder."""
        for node in self.nodes:
            if node.process is not None:
                node.process.stop(signal.SIGTERM)
                node.process = None
            for forwarder in node.forwarders():
                forwarder.stop()
        self.zookeeper.stop()


def _last_error(log_path: Path) -> str:
    """The last line of a broker's log that reports an error (what made its start fail)."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "no log"
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return (errors or lines or ["empty log"])[-1][:500]
