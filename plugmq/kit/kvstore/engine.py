"""What the engine half of a key-value store (store_lmdb, store_rocks) works with: the option
fields the shared half reads, a read view of the key families, one atomic write set, and the
directory lock (one store per directory).

The key families themselves are described in :mod:`plugmq.kit.kvstore.base`.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from plugmq.core import StoreError

__all__ = ["STATE_KEY", "KVReader", "KVStoreOptions", "WriteSet", "lock_directory"]

STATE_KEY = b"state"


class KVStoreOptions(Protocol):
    """The option fields the shared half reads (both plugins' attrs classes have them)."""

    @property
    def flush(self) -> str: ...
    @property
    def flush_interval_ms(self) -> int: ...
    @property
    def file_reserved_hours(self) -> float: ...
    @property
    def verify_tail_records(self) -> int: ...
    @property
    def verify_tail_bytes(self) -> int: ...
    @property
    def retention_batch(self) -> int: ...


class KVReader(Protocol):
    """A consistent read view of the families (one LMDB read txn; RocksDB reads the live DB)."""

    def get(self, family: str, key: bytes) -> bytes | None: ...

    def scan(self, family: str, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Items in key order from ``start`` (the first key if None) to the family's end."""
        ...

    def keys_back(self, family: str, bound: bytes) -> Iterator[bytes]:
        """Keys in descending order, from the greatest key <= ``bound``."""
        ...

    def last(self, family: str) -> tuple[bytes, bytes] | None: ...


class WriteSet:
    """Range deletes, deletes and puts by family, for one atomic engine write."""

    __slots__ = ("deletes", "puts", "ranges")

    def __init__(self) -> None:
        self.ranges: list[tuple[str, bytes, bytes]] = []
        self.deletes: list[tuple[str, bytes]] = []
        self.puts: list[tuple[str, bytes, bytes]] = []

    def delete_range(self, family: str, start: bytes, end: bytes) -> None:
        """Delete every key in ``[start, end)``."""
        self.ranges.append((family, start, end))

    def delete(self, family: str, key: bytes) -> None:
        self.deletes.append((family, key))

    def put(self, family: str, key: bytes, value: bytes) -> None:
        self.puts.append((family, key, value))


def lock_directory(path: Path) -> int:
    """One store per directory: a second opener (this process or another) is refused."""
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(
            f"{path} is already open by another store (a running broker or process); close it first"
        ) from None
    return fd
