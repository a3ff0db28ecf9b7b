"""The brokers the console shows, reached through their admin endpoints only.

Given one or more ``--server`` addresses, the console asks the first that answers for
``cluster-list``; in a cluster every live broker (master or slave) is then called at its endpoint,
else each given server is one broker. Every call carries the signed-in account's signature (the
RocketMQ 5 HMAC the server's ACL checks) and, when the servers run TLS, goes over TLS with the CA
(and optional client certificate) given on the command line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import grpc

from plugmq.core.errors import ClientError, ConfigError, PlugmqError, ValidationError
from plugmq.server.admin import AdminClient

__all__ = ["Broker", "BrokerCall", "Credentials", "Fleet", "TlsFiles"]

_TIMEOUT_S = 10.0


@attrs.frozen
class TlsFiles:
    """TLS towards the admin endpoints: the CA that signed the servers' certificates, optionally a
    client certificate and key (when the servers ask for one)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("give both --tls-cert and --tls-key (a client certificate and its key), or neither")
        try:
            return grpc.ssl_channel_credentials(
                root_certificates=self.ca.read_bytes(),
                private_key=self.key.read_bytes() if self.key is not None else None,
                certificate_chain=self.cert.read_bytes() if self.cert is not None else None)
        except OSError as exc:
            raise ConfigError(f"cannot read a TLS file ({exc}); check --tls-ca / --tls-cert / --tls-key") from exc


@attrs.frozen
class Credentials:
    """An admin account of the servers' ACL (None for servers without ACL)."""

    access_key: str
    secret_key: str = attrs.field(repr=False)


@attrs.frozen
class Broker:
    """One broker as the console shows it (from ``cluster-list``, or a given server alone)."""

    name: str
    broker_id: int
    role: str
    endpoint: str
    room: str = ""
    epoch: int = 0


@attrs.frozen
class BrokerCall:
    """One broker's answer to a verb: its result, or the error it gave (shown on the page)."""

    broker: Broker
    result: Any = None
    error: str | None = None


class Fleet:
    """The servers given, the brokers behind them, and one admin client per (endpoint, account)."""

    def __init__(self, servers: Iterable[str], tls: TlsFiles | None = None, timeout_s: float = _TIMEOUT_S) -> None:
        self.servers = list(servers)
        if not self.servers:
            raise ValidationError("give at least one --server HOST:PORT")
        self._tls = tls.credentials() if tls is not None else None
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, Credentials | None], AdminClient] = {}

    def client(self, endpoint: str, credentials: Credentials | None) -> AdminClient:
        key = (endpoint, credentials)  # a changed secret is another key: never a client signing with an old one
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = AdminClient(
                    endpoint, access_key=credentials.access_key if credentials else None,
                    secret_key=credentials.secret_key if credentials else None, timeout_s=self._timeout,
                    channel_credentials=self._tls)
            return found

    def forget(self, credentials: Credentials) -> None:
        """Close the clients of an account (its session ended)."""
        with self._lock:
            gone = [key for key in self._clients if key[1] == credentials]
            clients = [self._clients.pop(key) for key in gone]
        for client in clients:
            client.close()

    def call(self, endpoint: str, verb: str, args: Mapping[str, Any], credentials: Credentials | None) -> Any:
        return self.client(endpoint, credentials).call(verb, args)

    def check(self, credentials: Credentials) -> None:
        """Whether the servers take ``credentials`` for admin calls: a signed ``broker-status`` on the
        first server that answers. A refusal (wrong secret, no admin right) raises at once; a server
        that cannot be reached passes the question to the next."""
        unreachable: list[str] = []
        for server in self.servers:
            try:
                self.call(server, "broker-status", {}, credentials)
                return
            except ClientError as exc:
                if "cannot reach" not in str(exc):
                    raise
                unreachable.append(str(exc))
        raise ClientError("; ".join(unreachable))

    def cluster(self, credentials: Credentials | None) -> tuple[str | None, dict[str, Any] | None, list[Broker]]:
        """(cluster name, the cluster-list view, the brokers); a server alone is a one-broker fleet."""
        errors = []
        for server in self.servers:
            try:
                view = self.call(server, "cluster-list", {}, credentials)
            except ClientError as exc:
                if "not in a cluster" in str(exc):
                    break  # the server said so (FAILED_PRECONDITION): the servers are the brokers
                errors.append(str(exc))
                continue
            brokers = [Broker(b["broker_name"], b["broker_id"], b["role"], b["endpoint"], b.get("room") or "",
                              b.get("epoch", 0)) for b in view["brokers"]]
            brokers.sort(key=lambda b: (b.name, b.broker_id))
            return view["cluster"], view, brokers
        else:
            if errors:
                raise ClientError("; ".join(errors))
        return None, None, [Broker(server, 0, "", server) for server in self.servers]

    def each(self, brokers: Iterable[Broker], verb: str, args: Mapping[str, Any],
             credentials: Credentials | None) -> list[BrokerCall]:
        """``verb`` on every broker; a broker that fails says why instead of failing the page."""
        out = []
        for broker in brokers:
            try:
                out.append(BrokerCall(broker, self.call(broker.endpoint, verb, args, credentials)))
            except PlugmqError as exc:
                out.append(BrokerCall(broker, error=str(exc)))
        return out

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

