"""Child process of ``plugmq bench store``'s restart measurement: fill a store, then keep writing.

Run as ``python -m plugmq.bench._restart_child PLUGIN DATA_DIR LOG_BYTES BODY_BYTES BATCH``. It
appends batches of ``BODY_BYTES`` messages (with a tag and a unique key, as the broker sends
them) until the commit log holds ``LOG_BYTES``, prints ``ready <messages> <bytes>`` and goes on
appending, so the parent's SIGKILL lands in the middle of a write, as a real crash would. On
SIGTERM it closes the store (a clean stop) and exits.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

TOPIC = "RestartTopic"
QUEUES = 4


def main(argv: list[str]) -> int:
    plugin, data_dir, log_bytes, body_bytes, batch = argv[1], Path(argv[2]), int(argv[3]), int(argv[4]), int(argv[5])
    out = os.dup(1)
    os.dup2(2, 1)  # anything the store logs goes to stderr; stdout carries the ready line
    from plugmq.broker.components import open_store
    from plugmq.core import AppendRequest, Prop, tags_code
    from plugmq.core.message import new_unique_id

    store = open_store(plugin, data_dir, options={"flush": "async"})
    bodies = [os.urandom(body_bytes) for _ in range(16)]
    code = tags_code("TagA")
    written = 0
    told = False
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    while not stopping:
        requests = [
            AppendRequest(TOPIC, (written + k) % QUEUES, bodies[k % len(bodies)], tags_code=code,
                          properties={Prop.TAGS: "TagA", Prop.UNIQ_KEY: new_unique_id()})
            for k in range(batch)
        ]
        results = store.append_batch(requests)
        written += len(results)
        end = results[-1].commit_log_offset + results[-1].size
        if not told and end >= log_bytes:
            os.write(out, f"ready {written} {end}\n".encode())
            told = True
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
