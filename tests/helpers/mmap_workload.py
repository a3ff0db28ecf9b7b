"""A store_mmap workload both append kernels and both scan kernels are compared on.

Requests with every kind of field the record encoder treats differently, appended singly and in
batches of random sizes, and the files a store leaves behind (to compare kernels byte for byte).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plugmq.core import AppendRequest, AppendResult, Prop
from plugmq.plugins.store_mmap import MmapMessageStore

__all__ = ["HOST", "SMALL", "files", "run", "varied_requests", "workload"]

HOST = "10.0.0.7:10911"
#: Small segments, queue files and index files, so a few hundred messages roll each of them.
SMALL: dict[str, Any] = {"commit_log_segment_size": 64 * 1024, "consume_queue_entries_per_file": 16,
                         "index_slot_count": 64, "index_max_entries": 200}


def varied_requests(rng: random.Random, count: int, seed: int, *, body: Callable[[random.Random, int], bytes],
                    hosts: Sequence[str], user_values: Sequence[str]) -> list[AppendRequest]:
    """Requests exercising every field the encoder treats differently (tags, keys, unique ids,
    user properties, non-IPv4 born hosts, the whole int ranges); ``body(rng, size)`` makes a body."""
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
            props["user"] = rng.choice(user_values)
        out.append(AppendRequest(
            topic=rng.choice(["TopicA", "TopicB", "%RETRY%g"]), queue_id=rng.randrange(3),
            body=body(rng, rng.choice([0, 1, 100, 3000])), properties=props,
            tags_code=rng.randrange(-(2**63), 2**63), born_timestamp_ms=rng.randrange(2**40),
            born_host=rng.choice(hosts), reconsume_times=rng.randrange(17), sys_flag=rng.randrange(16),
            prepared_transaction_offset=rng.randrange(2**40),
        ))
    return out


def workload(seed: int, count: int) -> list[AppendRequest]:
    """Requests with every kind of field the encoder treats differently (random bodies)."""
    return varied_requests(random.Random(seed), count, seed, body=lambda _rng, size: os.urandom(size),
                           hosts=["192.168.1.2:3456", "10.0.0.1:0", "[::1]:9876", "host.example:80"],
                           user_values=["", "v", "\ud800 lone surrogate", "\u4e2d\u6587"])


def run(store: MmapMessageStore, requests: list[AppendRequest], rng: random.Random) -> list[AppendResult]:
    """Append ``requests`` in order, singly or in batches of 2 to 40 as ``rng`` chooses."""
    results: list[AppendResult] = []
    i = 0
    while i < len(requests):
        size = rng.choice([1, 1, 2, 7, 40])
        chunk = requests[i : i + size]
        results += [store.append(chunk[0])] if size == 1 else store.append_batch(chunk)
        i += size
    return results


def files(root: Path) -> dict[str, bytes]:
    """Every file of a store below ``root`` (path -> bytes), but the lock, abort marker and checkpoint."""
    skip = {"lock", "abort", "checkpoint"}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}
