"""PEM certificates and keys read and checked when a config is loaded (shared by every TLS port).

``[server.tls]`` (:mod:`plugmq.server.tls`) and the ha channel's ``tls_*`` options
(:mod:`plugmq.plugins.ha.tls`) read their files through here, so a missing, unreadable, expired
or mismatched certificate or key is a ConfigError naming the option and the fix, never a port
that starts and then fails every handshake.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger

__all__ = ["check_key_pair", "pem_certificates", "read_pem"]

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
