"""PEM certificates and keys read and checked when a config is loaded (shared by every TLS port).

``[server.tls]`` (:mod:`plugmq.server.tls`) and the ha channel's ``tls_*`` options
(:mod:`plugmq.plugins.ha.tls`) and cluster_zk's (ZooKeeper over TLS) read their files through here, so a missing, unreadable, expired
or mismatched certificate or key is a ConfigError naming the option and the fix, never a port
that starts and then fails every handshake.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger

__all__ = ["check_cert_and_key", "check_key_pair", "pem_certificates", "pem_file_option", "read_pem"]

log = get_logger(__name__)


def read_pem(path: Path, what: str, where: str) -> bytes:
    """The bytes of ``path``; ConfigError naming ``where`` (the option) when it cannot be read."""
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


def pem_certificates(data: bytes, path: Path, where: str) -> list[Any]:
    """The certificates in PEM ``data`` (at least one; ConfigError otherwise)."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise ConfigError(f"{where}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return certificates


def check_key_pair(cert: bytes, key: bytes, cert_path: Path, key_path: Path, where: str, *,
                   cert_option: str = "cert", key_option: str = "key") -> None:
    """ConfigError unless ``key`` is the unencrypted private key of the first certificate of
    ``cert`` and that certificate has not expired (one not valid yet is logged)."""
    from cryptography.hazmat.primitives import serialization

    leaf = pem_certificates(cert, cert_path, f"{where}.{cert_option}")[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except TypeError:
        raise ConfigError(f"{where}.{key_option}: {key_path} is encrypted; give the key unencrypted (readable by "
                          "the server user only)") from None
    except ValueError as exc:
        raise ConfigError(f"{where}.{key_option}: {key_path} is not a PEM private key ({exc})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if private.public_key().public_bytes(encoding, public) != leaf.public_key().public_bytes(encoding, public):
        raise ConfigError(f"{where}: the key {key_path} does not belong to the certificate {cert_path} (its first "
                          "certificate is the server's; give the key it was issued for)")
    now = datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        raise ConfigError(f"{where}.{cert_option}: {cert_path} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} "
                          "UTC; peers refuse it: renew it")
    if leaf.not_valid_before_utc > now:
        log.warning("TLS certificate not valid yet: peers refuse it until then", cert=str(cert_path),
                    valid_from=leaf.not_valid_before_utc.isoformat())


def pem_file_option(plugin: str, what: str, *, certificates: bool = True) -> Callable[[object, Any, str], None]:
    """attrs validator of a plugin's PEM file option: "" (unset) or a readable file, holding
    certificates when ``certificates``; the ConfigError names ``plugins.<plugin>.<option>``."""

    def check(_inst: object, attr: Any, value: str) -> None:
        if value:
            path, where = Path(value).expanduser(), f"plugins.{plugin}.{attr.name}"
            data = read_pem(path, what, where)
            if certificates:
                pem_certificates(data, path, where)

    return check


def check_cert_and_key(where: str, cert: str, key: str, *, cert_option: str = "tls_cert",
                       key_option: str = "tls_key") -> None:
    """ConfigError unless both or neither of ``cert`` and ``key`` (file paths) are given, and a
    given pair is a valid certificate with its key (see :func:`check_key_pair`)."""
    if bool(cert) != bool(key):
        missing, given = (key_option, cert_option) if cert else (cert_option, key_option)
        raise ConfigError(f"{where}.{missing} missing: {where}.{given} is set; a certificate chain ({cert_option}) "
                          f"needs its private key ({key_option}), both PEM files")
    if cert:
        cert_path, key_path = Path(cert).expanduser(), Path(key).expanduser()
        check_key_pair(read_pem(cert_path, "certificate", f"{where}.{cert_option}"),
                       read_pem(key_path, "private key", f"{where}.{key_option}"), cert_path, key_path, where,
                       cert_option=cert_option, key_option=key_option)
