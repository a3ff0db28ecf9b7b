"""Receipt handles a client can neither guess nor use for another group.

The broker's pop service names a delivery ``queue:offset:seq`` (plugmq.broker.pop), where
``seq`` counts deliveries: anyone can count, so a client could ack (and so lose) another group's
messages by guessing. The server hands out ``queue:offset:seq~MAC`` instead, where MAC is an
HMAC-SHA256 over the group, the topic and the handle with a key of this broker's, and accepts
back only a handle whose MAC matches the group and topic of the call. The key is 32 random bytes
in ``<data_dir>/server/receipt.key`` (mode 0600), made once and kept across restarts, so handles
given out before a restart still work after it. With a cluster secret (``[plugins.ha]
secret_file``) the key is derived from it instead (HKDF with the broker name), so every broker of
the same name has the same key and handles given out by a master still work on the slave
promoted after it fails.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from pathlib import Path

from plugmq.core.contracts.replication import ClusterKeys
from plugmq.core.errors import ReceiptHandleError, StoreError
from plugmq.core.logs import get_logger
from plugmq.kit.fdlimit import fsync_dir

__all__ = ["ReceiptSealer"]

log = get_logger(__name__)

_KEY_BYTES = 32
_MAC_BYTES = 16
_SEPARATOR = "~"


def _load_or_make_key(path: Path) -> bytes:
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    except OSError as exc:
        raise StoreError(f"cannot read the receipt-handle key {path}: {exc.strerror or exc}") from exc
    if len(key) == _KEY_BYTES:
        return key
    if key:
        raise StoreError(f"the receipt-handle key {path} holds {len(key)} bytes, not {_KEY_BYTES}: it was damaged; "
                         "delete it to make a new one (receipt handles given out before then stop working)")
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(_KEY_BYTES)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    log.info("receipt-handle key made", path=str(path))
    return key


class ReceiptSealer:
    """Seals the pop service's receipt handles to a group and topic, and opens them again."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a receipt-handle key needs at least 16 bytes")
        self._key = key

    @classmethod
    def for_broker(cls, data_dir: Path, replication: object) -> ReceiptSealer:
        """The key derived from the cluster secret when the replication service holds one, else
        the broker's own key in ``data_dir``."""
        if isinstance(replication, ClusterKeys):
            key = replication.cluster_key("receipt handles")
            if key is not None:
                return cls(key)
        return cls.for_data_dir(data_dir)

    @classmethod
    def for_data_dir(cls, data_dir: Path) -> ReceiptSealer:
        """The sealer of the broker in ``data_dir``, its key made on first use and kept there."""
        return cls(_load_or_make_key(Path(data_dir) / "server" / "receipt.key"))

    def _mac(self, group: str, topic: str, handle: str) -> str:
        digest = hmac.digest(self._key, f"{group}\0{topic}\0{handle}".encode(), "sha256")  # one call, no HMAC object
        return base64.urlsafe_b64encode(digest[:_MAC_BYTES]).rstrip(b"=").decode()

    def seal(self, group: str, topic: str, handle: str) -> str:
        return f"{handle}{_SEPARATOR}{self._mac(group, topic, handle)}"

    def open(self, group: str, topic: str, sealed: str) -> str:
        """The pop service's handle inside ``sealed``; ReceiptHandleError when it was not issued to
        ``group`` on ``topic`` by this broker (forged, altered, or another group's)."""
        handle, separator, mac = sealed.rpartition(_SEPARATOR)
        if not separator or not hmac.compare_digest(mac.encode(), self._mac(group, topic, handle).encode()):
            raise ReceiptHandleError(f"receipt handle {sealed[:80]!r} was not issued by this broker to group "
                                     f"{group!r} on topic {topic!r} (forged, altered, or another group's); pass the "
                                     "receipt_handle of a message this group received")
        return handle
