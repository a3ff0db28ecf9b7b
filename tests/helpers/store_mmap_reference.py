"""A store_mmap data dir written by the kernels of an earlier build, kept to prove the format holds.

``tests/data/store_mmap_v1.tar.gz`` was written by :func:`write_reference_store` with the compiled
append kernel that still carried its own CRC-32 (``_crc32.h``, slicing by 8), before the kernels
moved to zlib's crc32. A store written now from the same requests must hold the same bytes, and
every record of the old one must read back and pass the recovery scan's CRC checks.

``python -m tests.helpers.store_mmap_reference OUT.tar.gz`` writes the archive again (only for a new
format version: the point of the archive is that it was written by older code).
"""

from __future__ import annotations

import random
import sys
import tarfile
import tempfile
from pathlib import Path

from plugmq.core import AppendRequest, ManualClock
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions
from tests.helpers.mmap_workload import varied_requests

ARCHIVE = Path(__file__).parent.parent / "data" / "store_mmap_v1.tar.gz"
HOST = "10.0.0.7:10911"
OPTIONS = {"commit_log_segment_size": 64 * 1024, "consume_queue_entries_per_file": 16, "index_slot_count": 64,
           "index_max_entries": 400, "preallocate_next_segment": False, "flush": "async"}


def _body(rng: random.Random, size: int) -> bytes:
    """``size`` bytes: 40 random ones repeated (CRC-32 sees every byte; the archive stays small)."""
    return (rng.randbytes(40) * (size // 40 + 1))[:size]


def reference_requests(count: int = 300, seed: int = 24) -> list[AppendRequest]:
    """The requests of the archive, the same on every run."""
    return varied_requests(random.Random(seed), count, seed, body=_body,
                           hosts=["192.168.1.2:3456", "10.0.0.1:0", "[::1]:9876"], user_values=["", "v", "\u4e2d\u6587"])


def open_store(path: Path, **options: object) -> MmapMessageStore:
    opts = MmapStoreOptions(**{**OPTIONS, **options})  # type: ignore[arg-type]
    return MmapMessageStore(path, opts, clock=ManualClock(1_700_000_000.0), store_host=HOST)


def write_reference_store(path: Path, kernel: str = "c") -> None:
    """Append :func:`reference_requests` (singles and batches in a fixed pattern) and close."""
    store = open_store(path, append_kernel=kernel)
    requests = reference_requests()
    rng = random.Random(5)
    i = 0
    while i < len(requests):
        size = rng.choice([1, 1, 3, 20])
        chunk = requests[i : i + size]
        if size == 1:
            store.append(chunk[0])
        else:
            store.append_batch(chunk)
        i += size
    store.close()


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "store"
        write_reference_store(data)
        with tarfile.open(out, "w:gz") as archive:
            archive.add(data, arcname="store")


if __name__ == "__main__":
    main(sys.argv[1])
