"""Vectorised tag pre-check over raw consume-queue bytes (numpy).

A RocketMQ consume-queue entry is 20 bytes, big-endian: commit-log offset (8), size (4), tag hash
code (8). :data:`CQ_ENTRY_DTYPE` maps that layout onto a numpy structured dtype, so a block of
entries is read without a copy and the subscription test ``code(t) & entry == code(t)`` runs
over all of them at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["CQ_ENTRY_DTYPE", "CQ_ENTRY_SIZE", "decode_block", "encode_block", "match_codes"]

CQ_ENTRY_DTYPE = np.dtype([("commit_log_offset", ">i8"), ("size", ">i4"), ("tag_hash", ">i8")])
CQ_ENTRY_SIZE = CQ_ENTRY_DTYPE.itemsize  # 20
assert CQ_ENTRY_SIZE == 20


def decode_block(raw: bytes | bytearray | memoryview) -> np.ndarray:
    """View raw consume-queue bytes as a structured array (no copy). The length must be a
    multiple of 20."""
    if len(raw) % CQ_ENTRY_SIZE:
        raise ValueError(
            f"a consume-queue block is a whole number of {CQ_ENTRY_SIZE}-byte entries; got {len(raw)} bytes"
        )
    return np.frombuffer(raw, dtype=CQ_ENTRY_DTYPE)


def encode_block(entries: Iterable[tuple[int, int, int]]) -> bytes:
    """Raw bytes for ``(commit_log_offset, size, tag_hash)`` triples (tests and benchmarks)."""
    return np.array(list(entries), dtype=CQ_ENTRY_DTYPE).tobytes()


def match_codes(codes: np.ndarray, subscription_codes: tuple[int, ...]) -> np.ndarray:
    """Boolean mask: for some subscription code ``c``, ``c & code == c`` (int64 semantics).

    An exact single-tag match passes (``c & c == c``), and so does a multi-tag entry whose OR-ed
    code contains all of ``c``'s bits. False positives are possible (hash collisions, bit
    containment); the client's exact check removes them.
    """
    values = np.asarray(codes)
    if values.dtype != np.int64:
        values = values.astype(np.int64)  # also turns big-endian views native, once
    mask = np.zeros(values.shape, dtype=bool)
    for code in subscription_codes:
        wanted = np.int64(code)
        mask |= (values & wanted) == wanted
    return mask
