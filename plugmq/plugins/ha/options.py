"""Options of the ha replication plugin (the ``[plugins.ha]`` table)."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from plugmq.kit.pemfiles import pem_file_option

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


def _master(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value:
        parse_address(value, what=attr.name)


def _secret_file(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value:
        from plugmq.kit.clustersecret import read_secret

        read_secret(value, what=f"plugins.ha.{attr.name}")


def _tls_file(doc: str, what: str, *, certificates: bool = True) -> Any:
    return attrs.field(default="", validator=pem_file_option("ha", what, certificates=certificates),
                       metadata={"expected": "a file path", "doc": doc})


@attrs.frozen
class HaOptions:
    """How a broker replicates (its role and id come from ``[broker] role`` and ``broker_id``).

    On a master: ``listen`` is where slaves connect (port 0 picks a free port; the bound address
    is logged and written to ``<data_dir>/ha/listen.addr``); ``advertise``, when set, is the
    address slaves are told to use instead (behind NAT or a relay; with failover it is what the
    elected master registers). ``sync_timeout_ms``: how long a send
    of a ``sync_master`` waits for its in-sync slaves before it is answered FLUSH_SLAVE_TIMEOUT
    (RocketMQ's syncFlushTimeout). The in-sync set (:mod:`plugmq.plugins.ha.insync`): a slave
    joins it once it is within ``join_gap_bytes`` of the log end (and holds all that was committed
    before it joined); a member whose connection is gone, or that has not caught up with the log
    for ``in_sync_lag_ms`` (0: half of ``sync_timeout_ms``, at least twice ``heartbeat_ms``),
    leaves it - with failover, only through a successful ZooKeeper write. A ``sync_master`` acks a
    send once every member holds it; consumers read what every member holds.
    ``transfer_batch_bytes``: the most bytes of log one transfer frame carries
    (haTransferBatchSize). ``min_in_sync_replicas``: the members (the master counted) the in-sync
    set must have for a ``sync_master`` to take a send (RocketMQ 5's minInSyncReplicas): 2, the
    default, answers SLAVE_NOT_AVAILABLE (before storing the message) while no slave is in the set;
    1 lets a master whose slaves are all gone ack alone - once its set shrank to itself, as a new
    master just elected by failover is until its old master catches up again.

    On a slave: ``master`` is the master's replication address (its ``listen``). The slave
    reconnects by itself after ``reconnect_ms``, doubling up to ``reconnect_max_ms``.

    Both: ``secret_file``: the cluster secret (at least 32 bytes; the same file on every broker):
    master and slave prove to each other that they hold it and are of the same broker name before
    anything else crosses the connection, and every frame after that is authenticated
    (:mod:`plugmq.plugins.ha.auth`). Without it the channel is open to anyone who reaches it (keep
    ``listen`` on loopback then). ``heartbeat_ms``: an idle master sends its end offset this often and the slave
    answers with its own; a peer silent for ``peer_timeout_ms`` is taken for dead and its
    connection closed.

    TLS (:mod:`plugmq.plugins.ha.tls`): ``tls_cert`` and ``tls_key`` (PEM, the key unencrypted)
    turn it on; every broker of the name needs its own pair, since failover may make any of them
    master. The master serves them; with ``tls_ca`` it requires each slave to present a
    certificate that CA signed. A slave presents them and follows only a master whose certificate
    ``tls_ca`` signed (without ``tls_ca``: the system's roots); ``tls_server_name``, when set, must
    also be a name (DNS or IP) in the master's certificate - else the CA alone vouches, since the
    master's address is often an IP. TLS keeps the stream confidential; the secret still proves
    the broker name: use both beyond loopback.
    """

    listen: str = attrs.field(default="127.0.0.1:0", validator=_listen)
    advertise: str = attrs.field(default="", validator=_master)  # "" or host:port, as master
    master: str = attrs.field(default="", validator=_master)
    sync_timeout_ms: int = attrs.field(default=5000, validator=[v.instance_of(int), v.ge(1)])
    join_gap_bytes: int = attrs.field(default=_MIB, validator=[v.instance_of(int), v.ge(0)])
    in_sync_lag_ms: int = attrs.field(default=0, validator=[v.instance_of(int), v.ge(0)])
    transfer_batch_bytes: int = attrs.field(default=256 * 1024, validator=[v.instance_of(int), v.ge(1024)])
    heartbeat_ms: int = attrs.field(default=1000, validator=[v.instance_of(int), v.ge(10)])
    peer_timeout_ms: int = attrs.field(default=10_000, validator=[v.instance_of(int), v.ge(100)])
    reconnect_ms: int = attrs.field(default=200, validator=[v.instance_of(int), v.ge(1)])
    reconnect_max_ms: int = attrs.field(default=5000, validator=[v.instance_of(int), v.ge(1)])
    connect_timeout_ms: int = attrs.field(default=3000, validator=[v.instance_of(int), v.ge(1)])
    min_in_sync_replicas: int = attrs.field(default=2, validator=[v.instance_of(int), v.ge(1), v.le(2)])
    secret_file: str = attrs.field(default="", validator=_secret_file, metadata={"expected": "a file path"})
    tls_cert: str = _tls_file("this broker's PEM certificate chain, leaf first (turns TLS on)", "certificate")
    tls_key: str = _tls_file("its PEM private key (unencrypted)", "private key", certificates=False)
    tls_ca: str = _tls_file("the cluster's CA: masters require slave certificates it signed, slaves "
                            "follow only a master it signed", "CA certificate")
    tls_server_name: str = attrs.field(default="", validator=v.instance_of(str), metadata={
        "doc": "a slave also checks this name in the master's certificate (empty: the CA alone vouches)"})

    def __attrs_post_init__(self) -> None:
        if self.peer_timeout_ms <= self.heartbeat_ms:
            raise ValueError(f"peer_timeout_ms ({self.peer_timeout_ms}) must be above heartbeat_ms "
                             f"({self.heartbeat_ms}), or every idle peer is taken for dead")
        if self.in_sync_lag_ms and self.in_sync_lag_ms <= self.heartbeat_ms:
            raise ValueError(f"in_sync_lag_ms ({self.in_sync_lag_ms}) must be above heartbeat_ms ({self.heartbeat_ms}), "
                             "or an idle slave leaves the in-sync set between two heartbeats")
        if self.tls_cert or self.tls_key or self.tls_ca:
            from plugmq.plugins.ha.tls import check_tls_files

            check_tls_files(self.tls_cert, self.tls_key, self.tls_ca)
        if self.tls_server_name and not self.tls_cert:
            raise ValueError("tls_server_name is set but TLS is off; set tls_cert, tls_key and tls_ca too")
        if self.reconnect_max_ms < self.reconnect_ms:
            raise ValueError(f"reconnect_max_ms ({self.reconnect_max_ms}) must be >= reconnect_ms ({self.reconnect_ms})")

    @property
    def tls(self) -> bool:
        """Whether the ha channel runs TLS (a certificate and key are given)."""
        return bool(self.tls_cert)

    @property
    def lag_limit_ms(self) -> int:
        """``in_sync_lag_ms``, or its default: half the sync timeout, at least two heartbeats."""
        return self.in_sync_lag_ms or max(self.sync_timeout_ms // 2, 2 * self.heartbeat_ms)
