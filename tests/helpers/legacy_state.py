"""State files as plugmq wrote them before service state moved into the journal (for import tests).

Before the journal, pop progress was a snapshot (``pop-snapshot.json``, with a generation) plus a
JSON-lines log of the operations since (``pop-<generation>.log``) in ``<data_dir>/broker/pop``
(earlier in ``<data_dir>/server``), and consumer offsets were one JSON file per group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from plugmq.core import MessageStore

__all__ = ["write_legacy_offsets", "write_legacy_pop"]


def write_legacy_pop(directory: Path, store: MessageStore, *, group: str, topic: str, next_offset: int,
                     inflight: Mapping[int, tuple[int, int, int]], log_ops: Sequence[list[Any]] = (),
                     generation: int = 1) -> list[Path]:
    """One lane (id 1) of ``group`` on queue 0 of ``topic``: the cursor at ``next_offset``, the
    messages ``inflight`` (queue offset -> attempt, invisible-until ms, handle seq) in the snapshot,
    and ``log_ops`` after it. Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for offset, (attempt, until_ms, seq) in sorted(inflight.items()):
        (entry,) = store.read_queue(topic, 0, offset, 1)
        rows.append([offset, attempt, until_ms, seq, entry.commit_log_offset, entry.size, None])
    seq = max((s for _, _, s in inflight.values()), default=0)
    snapshot = directory / "pop-snapshot.json"
    snapshot.write_text(json.dumps({"version": 1, "generation": generation, "seq": seq,
                                    "lanes": [[1, group, topic, 0, next_offset, rows]]}), encoding="utf-8")
    log = directory / f"pop-{generation}.log"
    log.write_bytes(b"".join(json.dumps(op).encode() + b"\n" for op in log_ops))
    return [log, snapshot]


def write_legacy_offsets(broker_dir: Path, group: str, table: Mapping[str, int], *, member: str | None = None,
                         dlq_resend: bool = False) -> Path:
    """An offset file under ``broker_dir`` (``<data_dir>/broker``) as plugmq wrote it before the journal:
    a clustering group's (``offsets/<group>.json``), a broadcasting member's
    (``offsets/broadcast/<group>/<member>.json``) or admin's dead-letter resend cursor
    (``dlq-resend/<group>.json``). ``table``: ``"topic@broker@queue"`` -> offset."""
    if dlq_resend:
        path = broker_dir / "dlq-resend" / f"{group}.json"
    elif member is not None:
        path = broker_dir / "offsets" / "broadcast" / group / f"{member}.json"
    else:
        path = broker_dir / "offsets" / f"{group}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(table)), encoding="utf-8")
    return path
