"""The ``[plugins.cluster_zk]`` table: which ZooKeeper ensemble, under which path, how long a session lives."""

from __future__ import annotations

import re
from typing import Any

import attrs

from plugmq.core.errors import ConfigError
from plugmq.kit.clustersecret import read_secret
from plugmq.kit.pemfiles import check_cert_and_key, pem_file_option

__all__ = ["ZkOptions"]

_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")


def _check_hosts(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'hosts must be a string like "zk1:2181,zk2:2181", got {value!r}')
    if "/" in value:
        raise ValueError(f"hosts {value!r} contains a path; put the path in the chroot option instead")
    for entry in value.split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f'hosts entry {entry.strip()!r} is not "host:port" (port 1..65535); '
                             f'hosts is a comma-separated list like "zk1:2181,zk2:2181"')


def _check_chroot(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or value == "/" or value.endswith("/"):
        raise ValueError(f'chroot must be an absolute ZooKeeper path like "/plugmq" (no trailing "/"), got {value!r}')
    segments = value[1:].split("/")
    for segment in segments:
        if segment in ("", ".", "..") or not _SEGMENT.fullmatch(segment):
            raise ValueError(f"chroot {value!r} has the path segment {segment!r}; use letters, digits and . _ - "
                             "(not '.' or '..' alone)")
    if segments[0] == "zookeeper":
        raise ValueError(f"chroot {value!r} is inside /zookeeper, which ZooKeeper reserves; pick another path")


def _check_seconds(low: float, high: float) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be a number of seconds from {low:g} to {high:g}, got {value!r}")
    return check


def _check_fraction(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.1 <= value <= 0.9:
        raise ValueError(f"{attribute.name} must be a fraction of the session timeout from 0.1 to 0.9, got {value!r}")


def _check_secret_file(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{attribute.name} must be a file path (a string), got {value!r}")
    if value:
        read_secret(value, what=f"plugins.cluster_zk.{attribute.name}")


@attrs.frozen
class ZkOptions:
    """``hosts``: the ensemble, "host:port,host:port". ``chroot``: the path every cluster lives under.

    ``session_timeout_s``: how long a broker may be silent before ZooKeeper ends its session, which
    removes it from every route (the server bounds it to 2..20 of its ``tickTime``; the value it
    grants is logged). ``connect_timeout_s``: how long a starting broker waits for the ensemble.
    ``lease_fraction``: an elected master acks and serves only while its last confirmed contact
    with ZooKeeper is younger than this fraction of the session timeout (the one ZooKeeper granted
    when smaller), so it stops before its session can expire and a successor be elected.
    ``secret_file``: the cluster secret (the same file as ``[plugins.ha] secret_file``): the
    session authenticates with it and every node the cluster writes is readable and writable
    only with it; registrations are signed with it (:mod:`plugmq.plugins.cluster_zk.security`).

    TLS to ZooKeeper (its ``secureClientPort``; ``hosts`` names those ports): on when ``tls_ca`` is
    set, the CA whose signature the ensemble's certificates must carry (the system's roots are
    trusted too, as kazoo loads them). ``tls_cert`` and ``tls_key``: this broker's client
    certificate and key, for an ensemble with ``ssl.clientAuth=need``. ``tls_check_hostname``:
    also check each host's name in its certificate (off: the CA alone vouches, as hosts are often
    IPs).
    """

    hosts: str = attrs.field(default="127.0.0.1:2181", validator=_check_hosts)
    chroot: str = attrs.field(default="/plugmq", validator=_check_chroot)
    session_timeout_s: float = attrs.field(default=10.0, validator=_check_seconds(1, 600))
    connect_timeout_s: float = attrs.field(default=15.0, validator=_check_seconds(0.5, 600))
    lease_fraction: float = attrs.field(default=0.6, validator=_check_fraction)
    secret_file: str = attrs.field(default="", validator=_check_secret_file, metadata={"expected": "a file path"})
    tls_ca: str = attrs.field(default="", validator=pem_file_option("cluster_zk", "CA certificate"), metadata={
        "expected": "a file path", "doc": "the CA that signed the ensemble's certificates (turns TLS on)"})
    tls_cert: str = attrs.field(default="", validator=pem_file_option("cluster_zk", "certificate"), metadata={
        "expected": "a file path", "doc": "this broker's PEM client certificate chain, for ssl.clientAuth=need"})
    tls_key: str = attrs.field(default="", validator=pem_file_option("cluster_zk", "private key", certificates=False),
                               metadata={"expected": "a file path", "doc": "its PEM private key (unencrypted)"})
    tls_check_hostname: bool = attrs.field(default=False, metadata={
        "doc": "also check each host's name in its certificate"})

    def __attrs_post_init__(self) -> None:
        check_cert_and_key("plugins.cluster_zk", self.tls_cert, self.tls_key)
        if (self.tls_cert or self.tls_check_hostname) and not self.tls_ca:
            raise ConfigError("plugins.cluster_zk: tls_cert or tls_check_hostname is set but tls_ca is not; TLS to "
                              "ZooKeeper is on when tls_ca names the CA that signed the ensemble's certificates")

    @property
    def tls(self) -> bool:
        """Whether the session runs over TLS."""
        return bool(self.tls_ca)
