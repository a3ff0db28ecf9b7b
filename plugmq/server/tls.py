"""TLS for ``plugmq serve``'s ports, and for the clients of its admin endpoint.

::

    [server.tls]
    cert = "certs/server.pem"     # PEM certificate chain, leaf first (relative to the config file)
    key = "certs/server.key"      # its PEM private key (unencrypted)
    client_ca = "certs/ca.pem"    # optional: clients must present a certificate this CA signed (mutual TLS)
    metrics = true                # the metrics port serves HTTPS with the same files (default true)

Every file is read and checked when the config is loaded, so a missing, unreadable, expired or
mismatched certificate or key is a ConfigError naming the file and the fix, never a server that
starts and then fails every handshake. The clients' side: :class:`ClientTls` (the CA that signed
the server's certificate, and a client certificate for mutual TLS) makes the channel credentials
of :class:`plugmq.server.admin.AdminClient` and ``plugmq admin --server``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.schema import dotted, non_empty, setting, structure
from plugmq.kit.addresses import beyond_loopback, exposed_warning
from plugmq.kit.pemfiles import check_key_pair, pem_certificates, read_pem

if TYPE_CHECKING:
    import grpc

__all__ = ["ClientTls", "TlsOptions", "TlsTable", "beyond_loopback", "parse_tls_table", "warn_when_exposed"]

log = get_logger(__name__)

@attrs.frozen
class TlsOptions:
    """The server's certificate chain and key (PEM bytes, checked), and the client CA for mutual TLS."""

    cert: bytes = attrs.field(repr=False)
    key: bytes = attrs.field(repr=False)
    client_ca: bytes | None = attrs.field(default=None, repr=False)
    metrics: bool = True
    cert_path: Path | None = None
    key_path: Path | None = None
    client_ca_path: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        import grpc

        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


def _file(doc: str) -> Any:
    return setting(None, doc=doc, expected="a file path (a string)",
                   validator=attrs.validators.optional(non_empty("name a PEM file")))


@attrs.frozen
class TlsTable:
    """``[server.tls]``: PEM files (relative to the config file), read and checked when the config is loaded."""

    cert: str | None = _file("PEM certificate chain, leaf first")
    key: str | None = _file("its PEM private key (unencrypted)")
    client_ca: str | None = _file("clients must present a certificate this CA signed (mutual TLS)")
    metrics: bool = setting(True, doc="the metrics port serves HTTPS with the same files")


def parse_tls_table(table: Any, *, source: str = "", base: Path | None) -> TlsOptions:
    """``[server.tls]`` into TlsOptions: files read relative to ``base`` (the config file's directory)."""
    checked = structure(table, TlsTable, source, ("server", "tls"))
    where = dotted(("server", "tls"), source)

    def path_of(value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() or base is None else base / path

    cert_path, key_path, ca_path = path_of(checked.cert), path_of(checked.key), path_of(checked.client_ca)
    if cert_path is None or key_path is None:
        missing = " and ".join(k for k, v in (("cert", cert_path), ("key", key_path)) if v is None)
        raise ConfigError(f"{where}: {missing} missing; TLS needs the server's certificate chain (cert) and its "
                          "private key (key), PEM files")
    cert = read_pem(cert_path, "certificate", f"{where}.cert")
    key = read_pem(key_path, "private key", f"{where}.key")
    check_key_pair(cert, key, cert_path, key_path, where)
    client_ca = None
    if ca_path is not None:
        client_ca = read_pem(ca_path, "client CA", f"{where}.client_ca")
        pem_certificates(client_ca, ca_path, f"{where}.client_ca")
    return TlsOptions(cert, key, client_ca, checked.metrics, cert_path, key_path, ca_path)


@attrs.frozen
class ClientTls:
    """How a client reaches a TLS server: the CA that signed its certificate (None: the system's
    roots), a client certificate and key for mutual TLS, and the name to check the server's
    certificate against when the address is not in it."""

    ca: bytes | None = attrs.field(default=None, repr=False)
    cert: bytes | None = attrs.field(default=None, repr=False)
    key: bytes | None = attrs.field(default=None, repr=False)
    server_name: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("a client certificate needs its key and a key its certificate; give both or neither")

    @classmethod
    def from_files(cls, ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None,
                   server_name: str | None = None) -> ClientTls:
        def read(path: str | Path | None, what: str) -> bytes | None:
            return None if path is None else read_pem(Path(path).expanduser(), what, "TLS")

        return cls(read(ca, "CA certificate"), read(cert, "client certificate"), read(key, "client key"), server_name)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        import grpc

        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def warn_when_exposed(port: str, address: str, *, tls: bool, authenticated: bool) -> None:
    """Say loudly when ``address`` listens beyond loopback without TLS (or without access control)."""
    exposed_warning(port, address, tls=tls, authenticated=authenticated,
                    fix="configure [server.tls] (and [server.acl]) or listen on 127.0.0.1")
