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

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.schema import dotted, non_empty, setting, structure
from plugmq.kit.addresses import beyond_loopback

if TYPE_CHECKING:
    import grpc

__all__ = ["ClientTls", "TlsOptions", "TlsTable", "beyond_loopback", "parse_tls_table", "warn_when_exposed"]

log = get_logger(__name__)

def _read(path: Path, what: str, where: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: {what} file {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"{where}: {what} file {path} is not readable by this user "
                          "(check its owner and mode)") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: {what} {path} is a directory; name the PEM file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {what} file {path}: {exc.strerror or exc}") from None


def _certificates(data: bytes, path: Path, where: str) -> list[Any]:
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise ConfigError(f"{where}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return certificates


def _check_pair(cert: bytes, key: bytes, cert_path: Path, key_path: Path, where: str) -> None:
    from cryptography.hazmat.primitives import serialization

    leaf = _certificates(cert, cert_path, f"{where}.cert")[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except TypeError:
        raise ConfigError(f"{where}.key: {key_path} is encrypted; give the key unencrypted (readable by the server "
                          "user only)") from None
    except ValueError as exc:
        raise ConfigError(f"{where}.key: {key_path} is not a PEM private key ({exc})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if private.public_key().public_bytes(encoding, public) != leaf.public_key().public_bytes(encoding, public):
        raise ConfigError(f"{where}: the key {key_path} does not belong to the certificate {cert_path} (its first "
                          "certificate is the server's; give the key it was issued for)")
    now = datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        raise ConfigError(f"{where}.cert: {cert_path} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
                          "clients refuse it: renew it")
    if leaf.not_valid_before_utc > now:
        log.warning("TLS certificate not valid yet: clients refuse it until then", cert=str(cert_path),
                    valid_from=leaf.not_valid_before_utc.isoformat())


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
    cert = _read(cert_path, "certificate", f"{where}.cert")
    key = _read(key_path, "private key", f"{where}.key")
    _check_pair(cert, key, cert_path, key_path, where)
    client_ca = None
    if ca_path is not None:
        client_ca = _read(ca_path, "client CA", f"{where}.client_ca")
        _certificates(client_ca, ca_path, f"{where}.client_ca")
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
            return None if path is None else _read(Path(path).expanduser(), what, "TLS")

        return cls(read(ca, "CA certificate"), read(cert, "client certificate"), read(key, "client key"), server_name)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        import grpc

        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def warn_when_exposed(port: str, address: str, *, tls: bool, authenticated: bool) -> None:
    """Say loudly when ``address`` listens beyond loopback without TLS (or without access control)."""
    host = address.rpartition(":")[0]
    if not beyond_loopback(host) or (tls and authenticated):
        return
    lacking = " and ".join(what for what, have in (("TLS", tls), ("access control", authenticated)) if not have)
    log.warning(f"SECURITY: the {port} listens on {address}, beyond loopback, without {lacking}: anyone on the "
                "network can " + ("read what it serves in clear" if not tls else "use it without credentials")
                + "; configure [server.tls] (and [server.acl]) or listen on 127.0.0.1",
                port=port, address=address, tls=tls, acl=authenticated)
