"""Child process of the storage kill test: append forever, report every acknowledged message.

Run as ``python -m plugmq.conformance._storage_child PLUGIN DATA_DIR OPTIONS_PICKLE FIRST_INDEX``.
Each line on stdout is written only after the store returned for that message:
``index queue_offset commit_log_offset queue_id``. The parent kills this process with SIGKILL
at an arbitrary moment, so the last write is usually in flight.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path

TOPIC = "KillTestTopic"
QUEUES = 3


def body_for(index: int) -> bytes:
    """Deterministic body: 8-byte index, then 0..6 KiB derived from it (checkable on its own)."""
    size = (index * 7919) % 6144
    return index.to_bytes(8, "big") + hashlib.shake_128(f"kill-test:{index}".encode()).digest(size)


def index_of(body: bytes) -> int | None:
    """The index a body was made for, or None if the body is not one of ours intact."""
    if len(body) < 8:
        return None
    index = int.from_bytes(body[:8], "big")
    return index if body == body_for(index) else None


def main(argv: list[str]) -> int:
    plugin, data_dir, options_file, first = argv[1], Path(argv[2]), Path(argv[3]), int(argv[4])
    # Acknowledgements own stdout; anything the store logs goes to stderr instead.
    out = os.dup(1)
    os.dup2(2, 1)
    from plugmq.broker.components import open_store
    from plugmq.core import AppendRequest, Prop

    options = pickle.loads(options_file.read_bytes())
    store = open_store(plugin, data_dir, options=options)
    index = first
    while index < first + 1_000_000:
        # Every fourth round is a batch, so a kill can also land inside a multi-message write.
        count = 1 + index % 5 if index % 4 == 0 else 1
        requests = [
            AppendRequest(TOPIC, (index + k) % QUEUES, body_for(index + k), properties={Prop.KEYS: f"k{index + k}"})
            for k in range(count)
        ]
        results = store.append_batch(requests) if count > 1 else [store.append(requests[0])]
        lines = "".join(
            f"{index + k} {r.queue_offset} {r.commit_log_offset} {requests[k].queue_id}\n" for k, r in enumerate(results)
        )
        os.write(out, lines.encode())
        index += count
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
