"""The cluster secret: one file every broker of a cluster holds, and the keys derived from it.

The ha channel's handshake (``plugmq.plugins.ha.auth``), receipt handles that survive a failover,
the ZooKeeper credential and the signature over registrations (``plugmq.plugins.cluster_zk``)
each use their own key, derived with HKDF-SHA256 from the secret, the purpose and a scope (the
broker name or the cluster name), so no key can stand in for another and the secret itself
never leaves the file.
"""

from __future__ import annotations

import stat
from pathlib import Path

from plugmq.core.errors import ConfigError, PluginError
from plugmq.core.logs import get_logger

__all__ = ["MIN_SECRET_BYTES", "derive_key", "read_secret"]

log = get_logger(__name__)

MIN_SECRET_BYTES = 32


def read_secret(path: str, *, what: str = "plugins.ha.secret_file") -> bytes:
    """The cluster secret in ``path`` (surrounding whitespace stripped); ConfigError saying what is wrong."""
    file = Path(path).expanduser()
    try:
        data = file.read_bytes().strip()
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"{what}: the cluster secret file {file} does not exist; make one with "
                          f"`head -c 48 /dev/urandom | base64 > {file}` and give every broker of the cluster a "
                          "copy") from None
    except PermissionError:
        raise ConfigError(f"{what}: the cluster secret file {file} is not readable by this user") from None
    except IsADirectoryError:
        raise ConfigError(f"{what}: {file} is a directory; name the cluster secret file") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read the cluster secret file {file}: {exc.strerror or exc}") from None
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(f"{what}: the cluster secret in {file} is {len(data)} bytes; it needs at least "
                          f"{MIN_SECRET_BYTES} (e.g. `head -c 48 /dev/urandom | base64 > {file}`)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("SECURITY: the cluster secret file is readable by other users; chmod 600 it",
                    path=str(file), mode=oct(mode & 0o777))
    return data


def derive_key(secret: bytes, purpose: str, scope: str) -> bytes:
    """A 32-byte key for ``purpose`` from the cluster secret, the same wherever ``scope`` (a broker or
    cluster name) is the same."""
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ModuleNotFoundError as exc:  # cryptography comes with the 'serve' extra
        raise PluginError(f"a cluster secret needs {exc.name!r}: pip install 'plugmq[serve]'") from exc
    info = b"plugmq\0" + purpose.encode() + b"\0" + scope.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
