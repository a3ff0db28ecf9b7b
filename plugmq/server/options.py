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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.config.broker import check_moved_server_keys, read_toml
from plugmq.core.errors import ConfigError
from plugmq.core.schema import Problems, Refusal, internal, setting
from plugmq.server.acl import Account, AclOptions, finish_acl
from plugmq.server.tls import TlsOptions, TlsTable, parse_tls_table

__all__ = ["SERVER_TABLES", "Account", "AclOptions", "ServerOptions", "load_serve_config", "parse_server_table"]

# Keys of [server] that belong to the broker now (read by plugmq.config.broker.load_config).
_BROKER_OWNED = ("groups", "default_group", "pop_fsync", "pop_compact_bytes")


def _positive(_inst: object, _attribute: object, value: float) -> None:
    if value <= 0:
        raise Refusal(f"must be a positive number, got {value!r}")


def _seconds(default: float, doc: str) -> Any:
    return setting(default, doc=doc, expected="a number of seconds", validator=_positive)


def _count(default: int, doc: str) -> Any:
    return setting(default, doc=doc, validator=_positive)


def _host_port(_inst: object, _attribute: object, value: str | None) -> None:
    if value is None:
        return
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise Refusal(f"must be 'host:port' (port 0 picks a free one), got {value!r}")


def _first_or_last(_inst: object, _attribute: object, value: str) -> None:
    if value not in ("first", "last"):
        raise Refusal(f"must be 'first' or 'last', got {value!r}")


@attrs.frozen
class ServerOptions:
    """How ``plugmq serve`` serves: every key of ``[server]`` is a field (``[server.tls]`` is read
    from its files into ``tls``). Group policies and the pop state are the broker's (``[groups]``,
    ``broker.pop_fsync``, ``broker.pop_compact_bytes``)."""

    listen: str = setting("127.0.0.1:8081", doc="host:port of the gRPC port", expected="'host:port'")
    advertise: str | None = setting(None, doc="the endpoint routes point clients to (default: the address they "
                                    "connected to)", expected="'host:port'")
    long_polling_s: float = _seconds(20.0, "a receive waits this long at most for messages (also capped by the "
                                     "call's deadline)")
    min_invisible_s: float = _seconds(1.0, "the shortest invisible duration accepted")
    max_invisible_s: float = _seconds(43_200.0, "the longest invisible duration accepted")
    default_invisible_s: float = _seconds(60.0, "used when a receive names none (push consumers' auto-renew mode)")
    max_batch: int = _count(32, "messages a receive returns at most")
    new_group_from: str = setting("first", doc="where a group's first receive starts on a queue: \"first\" keeps "
                                  "every stored message, \"last\" only new ones", expected="'first' or 'last'",
                                  validator=_first_or_last)
    executor_threads: int = _count(8, "threads serving requests")
    shutdown_grace_s: float = _seconds(5.0, "calls in flight get this long to finish at shutdown")
    acl: AclOptions = setting(factory=AclOptions, doc="access control ([server.acl], off unless enabled)")
    metrics_listen: str | None = setting(None, doc="host:port of the Prometheus endpoint (/metrics; port 0 picks a "
                                         "free one, logged as \"metrics served\"); absent: no metrics",
                                         expected="'host:port' of the Prometheus endpoint", validator=_host_port)
    tls: TlsOptions | None = internal(None, doc="TLS on the gRPC port and metrics ([server.tls], read from its files)")
    max_long_polls: int = _count(10_000, "receives waiting at once; more are answered TOO_MANY_REQUESTS")
    filter_cache_bytes: int = _count(64 << 20, "bytes of compiled subscriptions kept")
    workers: int = _count(1, "front-end processes serving the port (they decode and check requests, hand sends to "
                          "this process and relay the rest; plugmq.server.workers); 1: this process alone")

    def __attrs_post_init__(self) -> None:
        if self.min_invisible_s > self.max_invisible_s:
            raise Refusal(f"({self.min_invisible_s}) is above max_invisible_s ({self.max_invisible_s})",
                          key="min_invisible_s")


#: The tables ``plugmq serve`` reads, as the configuration reference lists them.
SERVER_TABLES: tuple[tuple[str, type], ...] = (("server", ServerOptions), ("server.tls", TlsTable))


def parse_server_table(table: Mapping[str, Any], *, source: str = "<mapping>",
                       config_file: Path | None = None) -> ServerOptions:
    """Validate a ``[server]`` table into ServerOptions; a ConfigError lists every problem, each
    naming its key path and the fix.

    ``config_file``: the file the table came from; TLS files and the accounts file are relative
    to its directory, and the accounts are reloaded from it."""
    found = Problems(source)
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: [server] must be a table, got {table!r}")
    try:
        check_moved_server_keys(table, source=source)  # read by the broker; checked here so errors come first
    except ConfigError as exc:
        found.extend(exc)
    served = {k: v for k, v in table.items() if k not in _BROKER_OWNED and k != "tls"}
    options = found.structure(served, ServerOptions, ("server",))
    tls = None
    if "tls" in table:
        try:
            tls = parse_tls_table(table["tls"], source=source,
                                  base=config_file.resolve().parent if config_file is not None else None)
        except ConfigError as exc:
            found.extend(exc)
    acl = None
    if options is not None:
        try:
            acl = finish_acl(options.acl, source=source, config_file=config_file)
        except ConfigError as exc:
            found.extend(exc)
    found.raise_any()
    assert options is not None and acl is not None
    return attrs.evolve(options, acl=acl, tls=tls)


def load_serve_config(path: str | Path) -> tuple[dict[str, Any], ServerOptions]:
    """Read a broker TOML file: the broker's part (for ``load_config``) and the ``[server]`` options.

    A relative ``broker.data_dir`` is made relative to the file's directory, as ``load_config``
    does for files.
    """
    file = Path(path)
    raw = read_toml(file)
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
