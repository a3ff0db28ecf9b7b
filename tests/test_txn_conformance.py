"""The transaction conformance suite applied to the txn plugin on store_lmdb and store_mmap."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from plugmq.conformance.transactions import TransactionConformance


@pytest.fixture(params=["store_lmdb", "store_mmap"])
def txn_plugins(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return (request.param, "txn", "alloc")


class TestTxnConformance(TransactionConformance):
    # store_mmap's default 1 GiB segments cost seconds per reopen; the clauses need a few KiB.
    PLUGIN_OPTIONS: ClassVar[dict[str, dict[str, Any]]] = {"store_mmap": {"commit_log_segment_size": 8 << 20, "consume_queue_entries_per_file": 1000,
                                     "index_slot_count": 1024, "index_max_entries": 4096}}
