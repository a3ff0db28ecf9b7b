"""A store_mmap data dir written by the kernels of an earlier build, kept to prove the format holds.

``tests/data/store_mmap_v1.tar.gz`` was written by :func:`write_reference_store` with the compiled
append kernel that still carried its own CRC-32 (``_crc32.h``, slicing by 8), before the kernels
moved to zlib's crc32. A store written now from the same requests must hold the same bytes, and
every record of the old one must read back and pass the recovery scan's CRC checks.

``python -m tests.store_mmap_reference OUT.tar.gz`` writes the archive again (only for a new
format version: the point of the archive is that it was written by older code).
"""

from __future__ import annotations

import random
import sys
import tarfile
import tempfile
from pathlib import Path

from plugmq.core import AppendRequest, ManualClock, Prop
from plugmq.plugins.store_mmap import MmapMessageStore, MmapStoreOptions

ARCHIVE = Path(__file__).parent / "data" / "store_mmap_v1.tar.gz"
HOST = "10.0.0.7:10911"
OPTIONS = {"commit_log_segment_size": 64 * 1024, "consume_queue_entries_per_file": 16, "index_slot_count": 64,
           "index_max_entries": 400, "preallocate_next_segment": False, "flush": "async"}
SKIPPED = {"lock", "abort", "checkpoint"}  # the checkpoint holds wall-clock flush times


def _body(rng: random.Random, size: int) -> bytes:
    """``size`` bytes: 40 random ones repeated (CRC-32 sees every byte; the archive stays small)."""
    return (rng.randbytes(40) * (size // 40 + 1))[:size]


def reference_requests(count: int = 300, seed: int = 24) -> list[AppendRequest]:
    """Requests exercising every field the encoder treats differently, the same on every run."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        props: dict[str, str] = {}
        if rng.random() < 0.8:
            props[Prop.TAGS] = rng.choice(["TagA", "TagB", "ü-tag"])
        if rng.random() < 0.5:
            props[Prop.KEYS] = " ".join(rng.choice(["k1", "k\u00e92", "k\U0001f600", f"o{i}"]) for _ in range(2))
        if rng.random() < 0.7:
            props[Prop.UNIQ_KEY] = f"UNIQ{seed:04X}{i:08X}"
        if rng.random() < 0.2:
            props["user"] = rng.choice(["", "v", "\u4e2d\u6587"])
        out.append(AppendRequest(
            topic=rng.choice(["TopicA", "TopicB", "%RETRY%g"]), queue_id=rng.randrange(3),
            body=_body(rng, rng.choice([0, 1, 100, 3000])), properties=props,
            tags_code=rng.randrange(-(2**63), 2**63), born_timestamp_ms=rng.randrange(2**40),
            born_host=rng.choice(["192.168.1.2:3456", "10.0.0.1:0", "[::1]:9876"]),
            reconsume_times=rng.randrange(17), sys_flag=rng.randrange(16),
            prepared_transaction_offset=rng.randrange(2**40),
        ))
    return out


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


def data_files(root: Path) -> dict[str, bytes]:
    """Every file of a data dir but the lock, abort marker and checkpoint, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in SKIPPED}


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "store"
        write_reference_store(data)
        with tarfile.open(out, "w:gz") as archive:
            archive.add(data, arcname="store")


if __name__ == "__main__":
    main(sys.argv[1])
