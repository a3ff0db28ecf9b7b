"""Options of the ha replication plugin (the ``[plugins.ha]`` table)."""

from __future__ import annotations

import attrs
from attrs import validators as v

__all__ = ["HaOptions", "parse_address"]

_MIB = 1024 * 1024


def parse_address(text: str, *, what: str, port_zero_ok: bool = False) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    low = 0 if port_zero_ok else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        raise ValueError(f"{what} must be 'host:port' with a port {low}..65535, got {text!r}")
    return host.strip("[]"), int(port)


def _listen(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    parse_address(value, what="listen", port_zero_ok=True)


def _master(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if value:
        parse_address(value, what="master")


@attrs.frozen
class HaOptions:
    """How a broker replicates (its role and id come from ``[broker] role`` and ``broker_id``).

    On a master: ``listen`` is where slaves connect (port 0 picks a free port; the bound address
    is logged and written to ``<data_dir>/ha/listen.addr``). ``sync_timeout_ms``: how long a send
    of a ``sync_master`` waits for a slave before it is answered FLUSH_SLAVE_TIMEOUT (RocketMQ's
    syncFlushTimeout). ``max_gap_bytes``: a slave further behind than this does not count as
    available; with none available a ``sync_master`` answers SLAVE_NOT_AVAILABLE at once
    (haMaxGapNotInSync). ``transfer_batch_bytes``: the most bytes of log one transfer frame
    carries (haTransferBatchSize). ``min_in_sync_replicas``: the copies (the master's own
    counted) a ``sync_master`` send needs (RocketMQ 5's minInSyncReplicas): 2, the default,
    waits for a slave and answers SLAVE_NOT_AVAILABLE without one; 1 lets a master whose slaves
    are all gone or out of sync ack alone - the in-sync set shrank to itself, as a new master just
    elected by failover is until its old master returns - and wait for a slave again once one is
    in sync.

    On a slave: ``master`` is the master's replication address (its ``listen``). The slave
    reconnects by itself after ``reconnect_ms``, doubling up to ``reconnect_max_ms``.

    Both: ``heartbeat_ms``: an idle master sends its end offset this often and the slave
    answers with its own; a peer silent for ``peer_timeout_ms`` is taken for dead and its
    connection closed.
    """

    listen: str = attrs.field(default="127.0.0.1:0", validator=_listen)
    master: str = attrs.field(default="", validator=_master)
    sync_timeout_ms: int = attrs.field(default=5000, validator=[v.instance_of(int), v.ge(1)])
    max_gap_bytes: int = attrs.field(default=256 * _MIB, validator=[v.instance_of(int), v.ge(1)])
    transfer_batch_bytes: int = attrs.field(default=256 * 1024, validator=[v.instance_of(int), v.ge(1024)])
    heartbeat_ms: int = attrs.field(default=1000, validator=[v.instance_of(int), v.ge(10)])
    peer_timeout_ms: int = attrs.field(default=10_000, validator=[v.instance_of(int), v.ge(100)])
    reconnect_ms: int = attrs.field(default=200, validator=[v.instance_of(int), v.ge(1)])
    reconnect_max_ms: int = attrs.field(default=5000, validator=[v.instance_of(int), v.ge(1)])
    connect_timeout_ms: int = attrs.field(default=3000, validator=[v.instance_of(int), v.ge(1)])
    min_in_sync_replicas: int = attrs.field(default=2, validator=[v.instance_of(int), v.ge(1), v.le(2)])

    def __attrs_post_init__(self) -> None:
        if self.peer_timeout_ms <= self.heartbeat_ms:
            raise ValueError(f"peer_timeout_ms ({self.peer_timeout_ms}) must be above heartbeat_ms "
                             f"({self.heartbeat_ms}), or every idle peer is taken for dead")
        if self.reconnect_max_ms < self.reconnect_ms:
            raise ValueError(f"reconnect_max_ms ({self.reconnect_max_ms}) must be >= reconnect_ms ({self.reconnect_ms})")
